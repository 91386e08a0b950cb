//! The only place in `stel-ingest` that calls the kernel directly. Each wrapper returns
//! [`SysError`] naming the call, so failures say what was attempted.

pub mod caps;
pub mod dirlock;
pub mod netlink;
pub mod signal;
pub mod slots;
pub mod uring;

use std::io;

/// A failed system call.
#[derive(Debug, thiserror::Error)]
#[error("{call}: {source}")]
pub struct SysError {
    pub call: &'static str,
    #[source]
    pub source: io::Error,
}

impl SysError {
    /// EAGAIN/EWOULDBLOCK (a receive timeout), EINTR or ENOBUFS: retry, nothing is broken.
    pub fn is_transient(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(libc::EAGAIN | libc::EINTR | libc::ENOBUFS)
        )
    }

    pub(crate) fn last(call: &'static str) -> Self {
        Self {
            call,
            source: io::Error::last_os_error(),
        }
    }
}

/// A connected pair of local datagram sockets (AF_UNIX, SOCK_DGRAM): the in-process transport
/// of `stel-ingestd --demo`, so the demo runs the daemon's real reader without root.
///
/// # Errors
/// `socketpair` failing.
pub fn local_datagram_pair() -> Result<(std::os::fd::OwnedFd, std::os::fd::OwnedFd), SysError> {
    use std::os::fd::FromRawFd;
    let mut fds = [0i32; 2];
    // SAFETY: `fds` is a live array of two ints the kernel fills on success.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(SysError::last("socketpair(AF_UNIX, SOCK_DGRAM)"));
    }
    // SAFETY: both descriptors are fresh and owned by nobody else.
    Ok(unsafe {
        (
            std::os::fd::OwnedFd::from_raw_fd(fds[0]),
            std::os::fd::OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

fn setsockopt_int(
    fd: std::os::fd::BorrowedFd<'_>,
    level: i32,
    opt: i32,
    v: i32,
    call: &'static str,
) -> Result<(), SysError> {
    use std::os::fd::AsRawFd;
    // SAFETY: passes a pointer to a live i32 and its size.
    let rc = unsafe { libc::setsockopt(fd.as_raw_fd(), level, opt, (&v as *const i32).cast(), 4) };
    if rc < 0 {
        return Err(SysError::last(call));
    }
    Ok(())
}

/// Sets a socket's send buffer (SO_SNDBUFFORCE when privileged, else SO_SNDBUF).
///
/// # Errors
/// Both setsockopt calls failing.
pub fn set_sndbuf(fd: std::os::fd::BorrowedFd<'_>, bytes: usize) -> Result<(), SysError> {
    let v = bytes.min(i32::MAX as usize) as i32;
    setsockopt_int(
        fd,
        libc::SOL_SOCKET,
        libc::SO_SNDBUFFORCE,
        v,
        "setsockopt(SO_SNDBUFFORCE)",
    )
    .or_else(|_| {
        setsockopt_int(
            fd,
            libc::SOL_SOCKET,
            libc::SO_SNDBUF,
            v,
            "setsockopt(SO_SNDBUF)",
        )
    })
}

/// Sets a socket's receive buffer (SO_RCVBUFFORCE when privileged, else SO_RCVBUF); the INT UDP
/// socket.
///
/// # Errors
/// Both setsockopt calls failing.
pub fn set_rcvbuf(fd: std::os::fd::BorrowedFd<'_>, bytes: usize) -> Result<(), SysError> {
    let v = bytes.min(i32::MAX as usize) as i32;
    setsockopt_int(
        fd,
        libc::SOL_SOCKET,
        libc::SO_RCVBUFFORCE,
        v,
        "setsockopt(SO_RCVBUFFORCE)",
    )
    .or_else(|_| {
        setsockopt_int(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            v,
            "setsockopt(SO_RCVBUF)",
        )
    })
}

/// Sets a socket's receive timeout (SO_RCVTIMEO).
///
/// # Errors
/// setsockopt failing.
pub fn set_recv_timeout(
    fd: std::os::fd::BorrowedFd<'_>,
    d: std::time::Duration,
) -> Result<(), SysError> {
    use std::os::fd::AsRawFd;
    let tv = libc::timeval {
        tv_sec: d.as_secs() as libc::time_t,
        tv_usec: d.subsec_micros() as libc::suseconds_t,
    };
    // SAFETY: passes a pointer to a live timeval and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of_val(&tv) as u32,
        )
    };
    if rc < 0 {
        return Err(SysError::last("setsockopt(SO_RCVTIMEO)"));
    }
    Ok(())
}

/// Sends one datagram on a connected socket, blocking while the peer's queue is full.
///
/// # Errors
/// `send` failing (EINTR is retried).
pub fn send(fd: std::os::fd::BorrowedFd<'_>, datagram: &[u8]) -> Result<(), SysError> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `datagram` is live for the call; the kernel copies it.
        let rc = unsafe { libc::send(fd.as_raw_fd(), datagram.as_ptr().cast(), datagram.len(), 0) };
        if rc >= 0 {
            return Ok(());
        }
        let e = SysError::last("send(datagram)");
        if e.source.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Most datagrams [`send_many`] passes to one `sendmmsg`.
pub const SEND_MANY_MAX: usize = 256;

/// Sends up to [`SEND_MANY_MAX`] datagrams on a connected socket with one `sendmmsg` call;
/// returns how many the kernel took (the rest: call again). Blocks like `send` while the
/// peer's queue is full.
///
/// # Errors
/// `sendmmsg` failing before the first datagram (EINTR is retried).
pub fn send_many(fd: std::os::fd::BorrowedFd<'_>, datagrams: &[&[u8]]) -> Result<usize, SysError> {
    use std::os::fd::AsRawFd;
    let n = datagrams.len().min(SEND_MANY_MAX);
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: plain C structs; all-zero is a valid (empty) value for both.
    let mut iov: [libc::iovec; SEND_MANY_MAX] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; SEND_MANY_MAX] = unsafe { std::mem::zeroed() };
    for (i, d) in datagrams[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: d.as_ptr() as *mut libc::c_void,
            iov_len: d.len(),
        };
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    loop {
        // SAFETY: `msgs[..n]` point at `iov[..n]`, which point at the live `datagrams`; the
        // kernel only reads them (and writes `msg_len`) during the call.
        let rc = unsafe { libc::sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = SysError::last("sendmmsg(datagrams)");
        if e.source.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// `SOL_UDP` options (linux/udp.h; not in every libc target).
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

/// Bytes of control buffer a receive needs for the UDP GRO segment size: `CMSG_SPACE(sizeof(int))`.
pub const UDP_GRO_CONTROL_BYTES: usize = cmsg_space(std::mem::size_of::<libc::c_int>());

/// `CMSG_ALIGN`: control messages are aligned to `size_t`.
const fn cmsg_align(n: usize) -> usize {
    n.next_multiple_of(std::mem::size_of::<usize>())
}

/// `CMSG_SPACE(n)`.
const fn cmsg_space(n: usize) -> usize {
    cmsg_align(std::mem::size_of::<libc::cmsghdr>()) + cmsg_align(n)
}

/// Turns UDP GRO on for a UDP socket (`setsockopt(SOL_UDP, UDP_GRO)`): the kernel may then hand
/// over several same-size datagrams of one sender as one buffer, with their size in a control
/// message ([`udp_gro_segment`]); a receiver that reads the socket must read that control
/// message, or it would take the buffer for one datagram.
///
/// # Minimum kernel version
/// 5.0 (UDP_GRO).
///
/// # Errors
/// setsockopt failing (kernel without UDP GRO: ENOPROTOOPT).
pub fn set_udp_gro(fd: std::os::fd::BorrowedFd<'_>) -> Result<(), SysError> {
    setsockopt_int(fd, libc::SOL_UDP, UDP_GRO, 1, "setsockopt(UDP_GRO)")
}

/// The UDP GRO segment size in a received control buffer (the bytes the kernel wrote), or
/// `None` when it carries none (the buffer holds one datagram).
pub fn udp_gro_segment(control: &[u8]) -> Option<u16> {
    const HDR: usize = std::mem::size_of::<libc::cmsghdr>();
    let word = std::mem::size_of::<usize>();
    let mut c = control;
    while c.len() >= HDR {
        // struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; } in native order.
        let len = usize::from_ne_bytes(c[..word].try_into().ok()?);
        let level = i32::from_ne_bytes(c[word..word + 4].try_into().ok()?);
        let kind = i32::from_ne_bytes(c[word + 4..word + 8].try_into().ok()?);
        if len < HDR || len > c.len() {
            return None;
        }
        if level == libc::SOL_UDP && kind == UDP_GRO && len >= HDR + 4 {
            let v = i32::from_ne_bytes(c[HDR..HDR + 4].try_into().ok()?);
            return u16::try_from(v).ok().filter(|&v| v > 0);
        }
        c = c.get(cmsg_align(len)..)?;
    }
    None
}

/// Sends up to [`SEND_MANY_MAX`] buffers on a connected UDP socket with one `sendmmsg`, each
/// buffer cut by the kernel into datagrams of `segment` bytes (UDP GSO, `UDP_SEGMENT`; the last
/// may be shorter; at most 64 per buffer, and at most 64 KiB). Returns how many buffers were
/// taken.
///
/// # Minimum kernel version
/// 4.18 (UDP_SEGMENT).
///
/// # Errors
/// `sendmmsg` failing before the first buffer (EINTR is retried).
pub fn send_many_gso(
    fd: std::os::fd::BorrowedFd<'_>,
    buffers: &[&[u8]],
    segment: u16,
) -> Result<usize, SysError> {
    use std::os::fd::AsRawFd;
    const CTL: usize = cmsg_space(2);
    let n = buffers.len().min(SEND_MANY_MAX);
    if n == 0 {
        return Ok(0);
    }
    // SAFETY: plain C structs; all-zero is a valid (empty) value for each.
    let mut iov: [libc::iovec; SEND_MANY_MAX] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut msgs: [libc::mmsghdr; SEND_MANY_MAX] = unsafe { std::mem::zeroed() };
    // One control message per buffer (u64 words: aligned for cmsghdr).
    let mut ctl = [[0u64; CTL / 8]; SEND_MANY_MAX];
    for (i, d) in buffers[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: d.as_ptr() as *mut libc::c_void,
            iov_len: d.len(),
        };
        // struct cmsghdr { size_t cmsg_len; int cmsg_level; int cmsg_type; } + a u16, native
        // order, as u64 words (64-bit targets: size_t is one word).
        const { assert!(std::mem::size_of::<libc::cmsghdr>() == 16 && CTL == 24) };
        let c = &mut ctl[i];
        let mut lt = [0u8; 8];
        lt[..4].copy_from_slice(&libc::SOL_UDP.to_ne_bytes());
        lt[4..].copy_from_slice(&UDP_SEGMENT.to_ne_bytes());
        let mut seg = [0u8; 8];
        seg[..2].copy_from_slice(&segment.to_ne_bytes());
        *c = [18, u64::from_ne_bytes(lt), u64::from_ne_bytes(seg)];
        msgs[i].msg_hdr.msg_iov = &mut iov[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
        msgs[i].msg_hdr.msg_control = c.as_mut_ptr().cast();
        msgs[i].msg_hdr.msg_controllen = CTL as _;
    }
    loop {
        // SAFETY: `msgs[..n]` point at `iov[..n]` (which point at the live `buffers`) and at
        // `ctl[..n]`, all live for the call; the kernel only reads them (and writes `msg_len`).
        let rc = unsafe { libc::sendmmsg(fd.as_raw_fd(), msgs.as_mut_ptr(), n as u32, 0) };
        if rc >= 0 {
            return Ok(rc as usize);
        }
        let e = SysError::last("sendmmsg(UDP_SEGMENT)");
        if e.source.raw_os_error() != Some(libc::EINTR) {
            return Err(e);
        }
    }
}

/// Datagrams the kernel dropped on a socket because its receive buffer was full
/// (`getsockopt(SO_MEMINFO)`, entry SK_MEMINFO_DROPS): the true loss count. ENOBUFS from
/// `recv` only marks that some happened.
///
/// # Errors
/// getsockopt failing.
pub fn meminfo_drops(fd: std::os::fd::BorrowedFd<'_>) -> Result<u64, SysError> {
    const SK_MEMINFO_DROPS: usize = 8;
    Ok(meminfo(fd)?[SK_MEMINFO_DROPS] as u64)
}

/// Bytes queued in a socket's receive buffer now (`getsockopt(SO_MEMINFO)`, entry
/// SK_MEMINFO_RMEM_ALLOC): the datagrams' kernel allocations (`truesize`), so at least their
/// payload bytes. What a stop drains: what had been received when it came.
///
/// # Errors
/// getsockopt failing.
pub fn meminfo_rmem_alloc(fd: std::os::fd::BorrowedFd<'_>) -> Result<u64, SysError> {
    const SK_MEMINFO_RMEM_ALLOC: usize = 0;
    Ok(meminfo(fd)?[SK_MEMINFO_RMEM_ALLOC] as u64)
}

/// `getsockopt(SO_MEMINFO)`: the SK_MEMINFO_* array (Linux 3.9; 9 entries since 4.6).
fn meminfo(fd: std::os::fd::BorrowedFd<'_>) -> Result<[u32; 16], SysError> {
    use std::os::fd::AsRawFd;
    let mut info = [0u32; 16];
    let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
    // SAFETY: `info` is a live buffer of `len` bytes; the kernel writes at most `len`.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_MEMINFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc < 0 {
        return Err(SysError::last("getsockopt(SO_MEMINFO)"));
    }
    Ok(info)
}

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`), once;
/// returns whether they are off.
///
/// Why: parquet's `ArrowWriter` builds a fresh column writer for every column of every row
/// group, and each DELTA_BINARY_PACKED encoder reserves a 1 MiB buffer (parquet 59,
/// `DEFAULT_BIT_WRITER_SIZE`) of which a row group touches a few KiB. mimalloc serves each as a
/// fresh 1 MiB page from an arena it has `madvise(MADV_HUGEPAGE)`d, so the first touch faults in
/// and zeroes a whole 2 MiB huge page: 1,921 × 2 MiB = 3.8 GB zeroed per row group of a 64 × 30
/// session. `perf` of `stel-bench parquet --quick` put 52 % of all cycles in the kernel's
/// `clear_page_erms` under `get_column_writer`. With THP off a fault zeroes only the 4 KiB page
/// that is touched. Nothing else in stel gains from THP: batches and receive slots are reused.
pub fn disable_transparent_huge_pages() -> bool {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        // SAFETY: PR_SET_THP_DISABLE takes integer arguments only and touches no memory of ours.
        let rc = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
        if rc != 0 {
            tracing::warn!(
                error = %std::io::Error::last_os_error(),
                "Cannot turn transparent huge pages off; the Parquet writer will fault in 2 MiB per column per row group."
            );
        }
        rc == 0
    })
}

/// Bytes the receivers ask the kernel for a datagram's source address: a `sockaddr_in6`, which
/// also holds a `sockaddr_in`.
pub const SOCKADDR_BYTES: u32 = std::mem::size_of::<libc::sockaddr_in6>() as u32;

/// Reads a `sockaddr_in` / `sockaddr_in6` as the kernel wrote it (`name`: the bytes it filled).
/// `None` for other families (netlink, unix) or when too short.
pub fn sockaddr_from_bytes(name: &[u8]) -> Option<std::net::SocketAddr> {
    use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
    let family = u16::from_ne_bytes([*name.first()?, *name.get(1)?]);
    let port = u16::from_be_bytes([*name.get(2)?, *name.get(3)?]);
    match i32::from(family) {
        libc::AF_INET => {
            let a: [u8; 4] = name.get(4..8)?.try_into().ok()?;
            Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(a), port)))
        }
        libc::AF_INET6 => {
            let flow = u32::from_be_bytes(name.get(4..8)?.try_into().ok()?);
            let a: [u8; 16] = name.get(8..24)?.try_into().ok()?;
            let scope = u32::from_ne_bytes(name.get(24..28)?.try_into().ok()?);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(a),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod sockaddr_tests {
    use super::*;

    #[test]
    fn ip_socket_addresses_are_read_and_others_refused() {
        let mut v4 = [0u8; 16];
        v4[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
        v4[2..4].copy_from_slice(&5900u16.to_be_bytes());
        v4[4..8].copy_from_slice(&[127, 0, 0, 2]);
        assert_eq!(
            sockaddr_from_bytes(&v4),
            Some("127.0.0.2:5900".parse().unwrap())
        );
        assert_eq!(sockaddr_from_bytes(&v4[..7]), None);
        let mut v6 = [0u8; 28];
        v6[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
        v6[2..4].copy_from_slice(&6000u16.to_be_bytes());
        v6[8..24].copy_from_slice(
            &"2001:db8::7"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets(),
        );
        assert_eq!(
            sockaddr_from_bytes(&v6),
            Some("[2001:db8::7]:6000".parse().unwrap())
        );
        assert_eq!(sockaddr_from_bytes(&v6[..20]), None);
        // AF_NETLINK: not an IP address.
        let mut nl = [0u8; 12];
        nl[..2].copy_from_slice(&(libc::AF_NETLINK as u16).to_ne_bytes());
        assert_eq!(sockaddr_from_bytes(&nl), None);
    }
}
