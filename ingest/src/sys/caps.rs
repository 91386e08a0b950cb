//! Dropping privileges once the sockets and the filter are set up.
//!
//! The daemon needs CAP_NET_ADMIN (netlink multicast membership, SO_RCVBUFFORCE) and CAP_BPF
//! (loading the socket filter) only at start. Afterwards it keeps working with none: joining a
//! generic netlink multicast group again after a family reload is allowed unprivileged
//! (NETLINK_GENERIC sets NL_CFG_F_NONROOT_RECV; unless a vendor marks its group
//! GENL_MCAST_CAP_NET_ADMIN, kernel ≥ 6.7), and the BPF map is updated through the fd it already
//! holds (measured: register/unregister/stats and attach work with no capability). A
//! NETLINK_USERSOCK group, in contrast, can only be joined with CAP_NET_ADMIN (measured: EPERM),
//! which is why the daemon joins it before dropping and never needs to re-join it. So [`drop_all`] clears every set — effective, permitted, inheritable, ambient and
//! the bounding set — and sets no_new_privs, so nothing can come back even through `execve`.
//!
//! Capabilities are per thread: call this on the main thread **before** spawning any other
//! thread (decoders, sinks), so every thread inherits the empty sets.
//!
//! # Minimum kernel version
//! PR_CAP_AMBIENT: 4.3. PR_CAPBSET_DROP: 2.6.25. capset v3: 2.6.26.
use super::SysError;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40)
}

/// Effective capabilities of this thread (a bit mask), as the kernel reports them.
///
/// # Errors
/// capget failing.
pub fn effective() -> Result<u64, SysError> {
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget with a v3 header reads into two CapData structs, which `data` provides.
    let rc = unsafe { libc::syscall(libc::SYS_capget, &mut hdr, data.as_mut_ptr()) };
    if rc < 0 {
        return Err(SysError::last("capget"));
    }
    Ok(data[0].effective as u64 | (data[1].effective as u64) << 32)
}

/// Drops every capability of the calling thread for good (see the module docs).
///
/// # Errors
/// A prctl or capset failing (the daemon treats that as fatal: it said it would drop them).
pub fn drop_all() -> Result<(), SysError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } < 0 {
        return Err(SysError::last("prctl(PR_SET_NO_NEW_PRIVS)"));
    }
    // SAFETY: prctl with integer arguments only.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } < 0
    {
        return Err(SysError::last("prctl(PR_CAP_AMBIENT_CLEAR_ALL)"));
    }
    for cap in 0..=last_cap() {
        // SAFETY: prctl with integer arguments only. EINVAL for a cap this kernel lacks is fine;
        // EPERM means we never had CAP_SETPCAP (unprivileged run): nothing to drop from there.
        let rc = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EPERM)) {
                return Err(SysError {
                    call: "prctl(PR_CAPBSET_DROP)",
                    source: e,
                });
            }
        }
    }
    let mut hdr = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let data = [CapData::default(); 2];
    // SAFETY: capset with a v3 header reads two CapData structs, which `data` provides.
    let rc = unsafe { libc::syscall(libc::SYS_capset, &mut hdr, data.as_ptr()) };
    if rc < 0 {
        return Err(SysError::last("capset"));
    }
    Ok(())
}

/// The group ID of `name` (a group name from the system's group database, or a number).
///
/// # Errors
/// No such group (`ENOENT`), or the lookup failing.
pub fn resolve_group(name: &str) -> Result<u32, SysError> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let c = std::ffi::CString::new(name).map_err(|_| SysError {
        call: "getgrnam_r",
        source: std::io::Error::from_raw_os_error(libc::EINVAL),
    })?;
    let mut buf = vec![0u8; 16 << 10];
    loop {
        // SAFETY: a zeroed `group` is a valid out-parameter; getgrnam_r writes it and the
        // strings it points to into `buf` (alive until we return, and we only read `gr_gid`).
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut out: *mut libc::group = std::ptr::null_mut();
        // SAFETY: every pointer is valid for the call; `buf.len()` is its size.
        let rc = unsafe {
            libc::getgrnam_r(
                c.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut out,
            )
        };
        match rc {
            0 if out.is_null() => {
                return Err(SysError {
                    call: "getgrnam_r",
                    source: std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("no group named {name:?}"),
                    ),
                })
            }
            0 => return Ok(grp.gr_gid),
            libc::ERANGE if buf.len() < 1 << 20 => buf.resize(buf.len() * 4, 0),
            e => {
                return Err(SysError {
                    call: "getgrnam_r",
                    source: std::io::Error::from_raw_os_error(e),
                })
            }
        }
    }
}

/// Makes `gid` the process's real, effective and saved group, so every file, directory and
/// socket it creates from now on belongs to that group (call while privileged, before any
/// other thread exists; [`drop_all`] comes after). Nothing happens when it already is.
///
/// # Errors
/// `setresgid` failing: without CAP_SETGID a process can only take a group it already has as
/// its real or saved group.
pub fn set_group(gid: u32) -> Result<(), SysError> {
    // SAFETY: getegid has no arguments and cannot fail.
    if unsafe { libc::getegid() } == gid {
        return Ok(());
    }
    // SAFETY: setresgid with integer arguments only.
    if unsafe { libc::setresgid(gid, gid, gid) } < 0 {
        return Err(SysError::last("setresgid"));
    }
    Ok(())
}
