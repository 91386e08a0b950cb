//! A raw netlink socket: NETLINK_USERSOCK for the emulator, tests and benches (and, with the
//! kernel-path issue, NETLINK_GENERIC for switches).
//!
//! # Minimum kernel version
//! NETLINK_USERSOCK multicast and NETLINK_ADD_MEMBERSHIP: 2.6.14. Root (or CAP_NET_ADMIN) is
//! needed to bind to / send to USERSOCK multicast groups.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::SysError;

/// An open netlink socket.
#[derive(Debug)]
pub struct NetlinkSocket {
    fd: OwnedFd,
}

fn sockaddr(groups: u32) -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    sa.nl_groups = groups;
    sa
}

impl NetlinkSocket {
    /// Opens and binds a NETLINK_USERSOCK socket (port ID chosen by the kernel).
    ///
    /// # Errors
    /// `socket` or `bind` failing (e.g. no permission).
    pub fn usersock() -> Result<Self, SysError> {
        // SAFETY: plain socket(2) call; the returned fd is owned by OwnedFd below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_USERSOCK,
            )
        };
        if fd < 0 {
            return Err(SysError::last("socket(AF_NETLINK, NETLINK_USERSOCK)"));
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let sa = sockaddr(0);
        // SAFETY: `sa` is a valid sockaddr_nl for the duration of the call.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of_val(&sa) as u32,
            )
        };
        if rc < 0 {
            return Err(SysError::last("bind(netlink)"));
        }
        Ok(Self { fd })
    }

    fn setsockopt_int(
        &self,
        level: i32,
        opt: i32,
        v: i32,
        call: &'static str,
    ) -> Result<(), SysError> {
        // SAFETY: passes a pointer to a live i32 and its size.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                level,
                opt,
                (&v as *const i32).cast(),
                4,
            )
        };
        if rc < 0 {
            return Err(SysError::last(call));
        }
        Ok(())
    }

    /// Joins multicast group `group` (1-based).
    ///
    /// # Errors
    /// `setsockopt(NETLINK_ADD_MEMBERSHIP)` failing.
    pub fn join_group(&self, group: u32) -> Result<(), SysError> {
        self.setsockopt_int(
            libc::SOL_NETLINK,
            libc::NETLINK_ADD_MEMBERSHIP,
            group as i32,
            "setsockopt(NETLINK_ADD_MEMBERSHIP)",
        )
    }

    /// Sets the receive buffer, past `rmem_max` when privileged (SO_RCVBUFFORCE), else SO_RCVBUF.
    ///
    /// # Errors
    /// Both setsockopt calls failing.
    pub fn set_rcvbuf(&self, bytes: usize) -> Result<(), SysError> {
        let v = bytes.min(i32::MAX as usize) as i32;
        self.setsockopt_int(
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            v,
            "setsockopt(SO_RCVBUFFORCE)",
        )
        .or_else(|_| {
            self.setsockopt_int(
                libc::SOL_SOCKET,
                libc::SO_RCVBUF,
                v,
                "setsockopt(SO_RCVBUF)",
            )
        })
    }

    /// Sets the send buffer (SO_SNDBUFFORCE, else SO_SNDBUF).
    ///
    /// # Errors
    /// Both setsockopt calls failing.
    pub fn set_sndbuf(&self, bytes: usize) -> Result<(), SysError> {
        let v = bytes.min(i32::MAX as usize) as i32;
        self.setsockopt_int(
            libc::SOL_SOCKET,
            libc::SO_SNDBUFFORCE,
            v,
            "setsockopt(SO_SNDBUFFORCE)",
        )
        .or_else(|_| {
            self.setsockopt_int(
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                v,
                "setsockopt(SO_SNDBUF)",
            )
        })
    }

    /// Sends one datagram to multicast group `group` (1..=32). ECONNREFUSED is success: the
    /// kernel returns it for USERSOCK multicast even though the message was delivered (measured).
    ///
    /// # Errors
    /// Any other `sendto` failure.
    pub fn send_multicast(&self, group: u32, datagram: &[u8]) -> Result<(), SysError> {
        debug_assert!((1..=32).contains(&group));
        let sa = sockaddr(1u32 << (group - 1));
        // SAFETY: `datagram` and `sa` are live for the call; the kernel copies the bytes.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                datagram.as_ptr().cast(),
                datagram.len(),
                0,
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of_val(&sa) as u32,
            )
        };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::ECONNREFUSED) {
                return Ok(());
            }
            return Err(SysError {
                call: "sendto(netlink multicast)",
                source: e,
            });
        }
        Ok(())
    }

    /// Receives one datagram into `buf`. Returns (bytes copied, true length); a true length
    /// larger than `buf` means the datagram was truncated (MSG_TRUNC).
    ///
    /// # Errors
    /// `recv` failing (EINTR and ENOBUFS included: the caller decides).
    pub fn recv(&self, buf: &mut [u8]) -> Result<(usize, usize), SysError> {
        // SAFETY: `buf` is a live, writable slice of the given length.
        let rc = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC,
            )
        };
        if rc < 0 {
            return Err(SysError::last("recv(netlink)"));
        }
        let len = rc as usize;
        Ok((len.min(buf.len()), len))
    }

    /// Sets a receive timeout so a blocking `recv` wakes up to check for shutdown.
    ///
    /// # Errors
    /// setsockopt failing.
    pub fn set_recv_timeout(&self, d: std::time::Duration) -> Result<(), SysError> {
        let tv = libc::timeval {
            tv_sec: d.as_secs() as libc::time_t,
            tv_usec: d.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: passes a pointer to a live timeval and its size.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
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

    /// Kernel drops on this socket (SO_MEMINFO, SK_MEMINFO_DROPS): datagrams lost because the
    /// receive buffer was full.
    ///
    /// # Errors
    /// getsockopt failing.
    pub fn drops(&self) -> Result<u64, SysError> {
        const SK_MEMINFO_DROPS: usize = 8;
        let mut info = [0u32; 16];
        let mut len = std::mem::size_of_val(&info) as libc::socklen_t;
        // SAFETY: `info` is a live buffer of `len` bytes; the kernel writes at most `len`.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MEMINFO,
                info.as_mut_ptr().cast(),
                &mut len,
            )
        };
        if rc < 0 {
            return Err(SysError::last("getsockopt(SO_MEMINFO)"));
        }
        Ok(info[SK_MEMINFO_DROPS] as u64)
    }
}
