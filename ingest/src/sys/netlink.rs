//! A raw netlink socket: NETLINK_USERSOCK for the emulator, tests and benches, NETLINK_GENERIC
//! for switches (the `sonic_stel` family and nlctrl, see [`crate::genl`]).
//!
//! # Minimum kernel version
//! NETLINK_USERSOCK multicast and NETLINK_ADD_MEMBERSHIP / NETLINK_DROP_MEMBERSHIP: 2.6.14.
//! NETLINK_GENERIC: 2.6.15. NETLINK_LIST_MEMBERSHIPS: 4.2. MSG_DONTWAIT, poll(2): 2.2. Root (or
//! CAP_NET_ADMIN) is needed to bind to / send to USERSOCK multicast groups; NETLINK_GENERIC
//! groups can be joined unprivileged unless the family flags the group
//! GENL_MCAST_CAP_NET_ADMIN / GENL_MCAST_CAP_SYS_ADMIN (6.7+).

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
        Self::open(
            libc::NETLINK_USERSOCK,
            "socket(AF_NETLINK, NETLINK_USERSOCK)",
        )
    }

    /// Opens and binds a NETLINK_GENERIC socket (port ID chosen by the kernel): the transport of
    /// the switch's `sonic_stel` family and of nlctrl requests/notifications.
    ///
    /// # Errors
    /// `socket` or `bind` failing.
    pub fn generic() -> Result<Self, SysError> {
        Self::open(libc::NETLINK_GENERIC, "socket(AF_NETLINK, NETLINK_GENERIC)")
    }

    fn open(protocol: i32, call: &'static str) -> Result<Self, SysError> {
        // SAFETY: plain socket(2) call; the returned fd is owned by OwnedFd below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                protocol,
            )
        };
        if fd < 0 {
            return Err(SysError::last(call));
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

    /// Leaves multicast group `group` (1-based). Leaving a group the socket is not in (e.g. one
    /// the kernel already cleared when the family was unregistered) succeeds.
    ///
    /// # Errors
    /// `setsockopt(NETLINK_DROP_MEMBERSHIP)` failing.
    pub fn leave_group(&self, group: u32) -> Result<(), SysError> {
        self.setsockopt_int(
            libc::SOL_NETLINK,
            libc::NETLINK_DROP_MEMBERSHIP,
            group as i32,
            "setsockopt(NETLINK_DROP_MEMBERSHIP)",
        )
    }

    /// The multicast groups this socket is a member of, ascending (NETLINK_LIST_MEMBERSHIPS,
    /// kernel 4.2). The kernel removes every member from a generic netlink group when its family
    /// is unregistered, so this is how a missed remove/re-add is detected.
    ///
    /// # Errors
    /// getsockopt failing.
    pub fn memberships(&self) -> Result<Vec<u32>, SysError> {
        // Up to 64 words (2048 groups) in one call; the kernel reports the length it needs and
        // we retry once with that if it is larger (genl group IDs are allocated densely).
        let mut words = vec![0u32; 64];
        for _ in 0..2 {
            let mut len = (words.len() * 4) as libc::socklen_t;
            // SAFETY: `words` is a live buffer of `len` bytes; the kernel writes at most `len`
            // bytes and stores the length it needs in `len`.
            let rc = unsafe {
                libc::getsockopt(
                    self.fd.as_raw_fd(),
                    libc::SOL_NETLINK,
                    libc::NETLINK_LIST_MEMBERSHIPS,
                    words.as_mut_ptr().cast(),
                    &mut len,
                )
            };
            if rc < 0 {
                return Err(SysError::last("getsockopt(NETLINK_LIST_MEMBERSHIPS)"));
            }
            let needed = (len as usize).div_ceil(4);
            if needed <= words.len() {
                words.truncate(needed);
                let mut out = Vec::new();
                for (w, bits) in words.iter().enumerate() {
                    for b in 0..32 {
                        if bits & (1 << b) != 0 {
                            out.push((w * 32 + b + 1) as u32);
                        }
                    }
                }
                return Ok(out);
            }
            words = vec![0u32; needed];
        }
        Err(SysError {
            call: "getsockopt(NETLINK_LIST_MEMBERSHIPS)",
            source: std::io::Error::other("membership list kept growing"),
        })
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
        super::set_sndbuf(std::os::fd::AsFd::as_fd(self), bytes)
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

    /// Sends one request to the kernel (nl_pid 0, no groups), e.g. an nlctrl CTRL_CMD_GETFAMILY.
    /// Generic netlink runs the handler in the sender's context, so the reply is queued on this
    /// socket when `sendto` returns.
    ///
    /// # Errors
    /// `sendto` failing.
    pub fn send_to_kernel(&self, msg: &[u8]) -> Result<(), SysError> {
        let sa = sockaddr(0);
        // SAFETY: `msg` and `sa` are live for the call; the kernel copies the bytes.
        let rc = unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of_val(&sa) as u32,
            )
        };
        if rc < 0 {
            return Err(SysError::last("sendto(netlink kernel)"));
        }
        Ok(())
    }

    /// Like [`recv`](Self::recv) but never blocks (MSG_DONTWAIT): `Ok(None)` when nothing is
    /// queued.
    ///
    /// # Errors
    /// `recv` failing with anything but EAGAIN (ENOBUFS included: notifications were lost).
    pub fn try_recv(&self, buf: &mut [u8]) -> Result<Option<(usize, usize)>, SysError> {
        // SAFETY: `buf` is a live, writable slice of the given length.
        let rc = unsafe {
            libc::recv(
                self.fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_TRUNC | libc::MSG_DONTWAIT,
            )
        };
        if rc < 0 {
            let e = SysError::last("recv(netlink, MSG_DONTWAIT)");
            if matches!(e.source.raw_os_error(), Some(libc::EAGAIN)) {
                return Ok(None);
            }
            return Err(e);
        }
        let len = rc as usize;
        Ok(Some((len.min(buf.len()), len)))
    }

    /// Waits up to `timeout` for the socket to become readable (poll(2), POLLIN). Returns false
    /// on timeout or EINTR. A zero timeout only checks.
    ///
    /// # Errors
    /// `poll` failing with anything but EINTR.
    pub fn wait_readable(&self, timeout: std::time::Duration) -> Result<bool, SysError> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `pfd` is one live pollfd for the duration of the call.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = SysError::last("poll(netlink)");
            if e.source.raw_os_error() == Some(libc::EINTR) {
                return Ok(false);
            }
            return Err(e);
        }
        Ok(rc > 0)
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
        super::set_recv_timeout(std::os::fd::AsFd::as_fd(self), d)
    }

    /// Kernel drops on this socket (SO_MEMINFO, SK_MEMINFO_DROPS): datagrams lost because the
    /// receive buffer was full.
    ///
    /// # Errors
    /// getsockopt failing.
    pub fn drops(&self) -> Result<u64, SysError> {
        super::meminfo_drops(std::os::fd::AsFd::as_fd(self))
    }
}

impl std::os::fd::AsFd for NetlinkSocket {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        std::os::fd::AsFd::as_fd(&self.fd)
    }
}
