//! The two datagram receivers over a [`SlotPool`]: io_uring multishot `RecvMsg` with a provided
//! buffer ring ([`UringRecv`], the fast path), and a plain `recv` loop ([`RecvLoop`], the
//! baseline in `stel-bench netlink` and the fallback where io_uring is disabled).
//!
//! Both deliver each complete datagram as a [`Lease`] on the slot it landed in: no allocation or
//! copy per datagram. A datagram longer than a slot is never spliced: the kernel flags it
//! (MSG_TRUNC), it is counted and its slot goes straight back.
//!
//! # Minimum kernel version
//! - `IORING_REGISTER_PBUF_RING` (provided buffer rings): 5.19.
//! - `IORING_OP_RECVMSG` with `IORING_RECV_MULTISHOT`: 6.0.
//! - `IORING_ENTER_EXT_ARG` (wait with a timeout): 5.11.
//! - `IORING_SETUP_DEFER_TASKRUN` + `SINGLE_ISSUER`: 6.1 (used when available). The ring must
//!   then only be driven by the thread that created it: [`UringRecv`] is created and polled on
//!   the daemon's reader thread.
//!
//! # Troubleshooting
//! `io_uring_setup` fails with EPERM when `kernel.io_uring_disabled` is 2 (or 1 without the
//! io_uring group); the daemon then logs and uses [`RecvLoop`].
use std::{
    alloc::{self, Layout},
    os::fd::{AsRawFd, BorrowedFd, OwnedFd},
    ptr::NonNull,
    sync::atomic::{AtomicU16, Ordering},
    time::Duration,
};

use io_uring::{cqueue, opcode, types, IoUring};

use super::{
    slots::{Lease, SlotPool},
    SysError, SOCKADDR_BYTES,
};

/// What the receivers count. Plain numbers; the reader thread owns them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RecvStats {
    /// Complete datagrams delivered.
    pub datagrams: u64,
    /// Their bytes (netlink headers included).
    pub bytes: u64,
    /// Datagrams longer than a slot (MSG_TRUNC): counted and dropped, never spliced.
    pub truncated: u64,
    /// Times the provided-buffer ring ran dry (ENOBUFS ends the multishot): the receive was
    /// re-armed once slots came back. Not loss: the socket buffer holds the data meanwhile.
    pub rearms_no_buffers: u64,
    /// Other re-arms (the kernel ended the multishot for its own reasons).
    pub rearms: u64,
    /// Receive errors other than the above (counted, the loop continues).
    pub errors: u64,
    /// Waits that found no free slot (decoders hold them all).
    pub no_free_slot: u64,
    /// Receive calls (io_uring_enter / recv batches): datagrams ÷ polls is the batching.
    pub polls: u64,
}

const RECV_USER_DATA: u64 = 1;
const CANCEL_USER_DATA: u64 = 2;
const BUF_GROUP: u16 = 0;

fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd, SysError> {
    fd.try_clone_to_owned().map_err(|source| SysError {
        call: "dup(socket)",
        source,
    })
}

/// io_uring multishot `RecvMsg` into a provided buffer ring whose buffers are the pool's slots.
pub struct UringRecv {
    ring: IoUring,
    /// Our own descriptor of the socket (a dup), so the ring never outlives it.
    fd: OwnedFd,
    /// The provided-buffer ring (`io_uring_buf` entries), page-aligned, registered as group 0.
    bufs: NonNull<types::BufRingEntry>,
    bufs_layout: Layout,
    mask: u16,
    tail: u16,
    /// Slots currently in the kernel's buffer ring.
    in_ring: usize,
    /// Slot length given to the kernel.
    slot_len: u32,
    /// Boxed so its address is stable while the multishot request is live: the kernel reads
    /// `msg_namelen`/`msg_controllen`. Control is 0; the name is 0 (netlink: the payload starts
    /// right after the 16-byte `io_uring_recvmsg_out`) or [`super::SOCKADDR_BYTES`] (UDP: the
    /// kernel writes the sender's address between that header and the payload).
    msghdr: Box<libc::msghdr>,
    armed: bool,
    pending_publish: bool,
    /// [`Self::set_batch_wait`]: µs a wait collects datagrams before it returns with the first
    /// (0: returns at the first).
    min_wait_us: u32,
}

/// Completions a batching wait asks for: more than arrive within its `min_wait_us` at the
/// design rate, so the wait ends by that timer (or, once it expired, at the first datagram).
const BATCH_WANT: usize = 32;

impl std::fmt::Debug for UringRecv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringRecv")
            .field("fd", &self.fd)
            .field("in_ring", &self.in_ring)
            .field("armed", &self.armed)
            .finish_non_exhaustive()
    }
}

// SAFETY: the ring, the buffer-ring memory and the msghdr are owned by this value and only used
// through `&mut self`; moving it to another thread moves all of them together.
unsafe impl Send for UringRecv {}

fn uring_err(call: &'static str, source: std::io::Error) -> SysError {
    SysError { call, source }
}

impl UringRecv {
    /// Sets up a ring for `sock` and gives the kernel every free slot of `pool`. `names`: ask
    /// for each datagram's source address (UDP), readable with [`SlotPool::source`].
    ///
    /// # Errors
    /// `io_uring_setup` failing (io_uring disabled: EPERM; too old: ENOSYS) or the buffer ring
    /// registration failing (kernel < 5.19).
    pub fn new(sock: BorrowedFd<'_>, pool: &mut SlotPool, names: bool) -> Result<Self, SysError> {
        // DEFER_TASKRUN + SINGLE_ISSUER (6.1): completions are produced only when this thread
        // enters the kernel to wait, in one batch, instead of the sender's wakeup interrupting
        // the reader for every datagram. Older kernels: plain setup.
        let ring = IoUring::builder()
            .setup_cqsize(4096)
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(64)
            .or_else(|_| IoUring::builder().setup_cqsize(4096).build(64))
            .map_err(|e| uring_err("io_uring_setup", e))?;
        let entries = (pool.slots() as usize).next_power_of_two().min(32768);
        let bufs_layout =
            Layout::from_size_align(entries * std::mem::size_of::<types::BufRingEntry>(), 4096)
                .expect("buffer ring layout");
        // SAFETY: non-zero size (entries >= 1).
        let mem = unsafe { alloc::alloc_zeroed(bufs_layout) };
        let Some(bufs) = NonNull::new(mem.cast::<types::BufRingEntry>()) else {
            alloc::handle_alloc_error(bufs_layout)
        };
        // SAFETY: `bufs` points to `entries` zeroed, page-aligned entries that stay allocated
        // until `Drop`, which unregisters the group before freeing them.
        let reg = unsafe {
            ring.submitter().register_buf_ring_with_flags(
                bufs.as_ptr() as u64,
                entries as u16,
                BUF_GROUP,
                0,
            )
        };
        if let Err(e) = reg {
            // SAFETY: allocated above with this layout; never registered.
            unsafe { alloc::dealloc(mem, bufs_layout) };
            return Err(uring_err("io_uring_register(PBUF_RING)", e));
        }
        // SAFETY: msghdr is plain old data; all-zero means no name, no control, no iovec
        // (multishot recvmsg takes the buffer from the ring).
        let mut msghdr: Box<libc::msghdr> = Box::new(unsafe { std::mem::zeroed() });
        if names {
            // Multishot recvmsg reserves this many bytes for the name in every buffer; the
            // pointer stays null (the kernel writes into the buffer, not msg_name).
            msghdr.msg_namelen = super::SOCKADDR_BYTES;
        }
        let mut me = Self {
            ring,
            fd: dup(sock)?,
            bufs,
            bufs_layout,
            mask: (entries - 1) as u16,
            tail: 0,
            in_ring: 0,
            slot_len: pool.slot_len().min(u32::MAX as usize) as u32,
            msghdr,
            armed: false,
            pending_publish: false,
            min_wait_us: 0,
        };
        while let Some(slot) = pool.take_free() {
            if me.in_ring == entries {
                pool.put_free(slot);
                break;
            }
            me.give_back(pool, slot);
        }
        me.publish();
        Ok(me)
    }

    /// Asks the kernel for each receive's UDP GRO segment size (a control message in every
    /// buffer; readable with [`SlotPool::segment`]). Call before the first poll, on a socket
    /// with [`super::set_udp_gro`] on.
    pub fn want_gro_segments(&mut self) {
        debug_assert!(!self.armed, "the multishot receive is armed already");
        self.msghdr.msg_controllen = super::UDP_GRO_CONTROL_BYTES as _;
    }

    /// Lets each wait collect datagrams for up to `us` µs before it returns (io_uring's
    /// `min_wait_usec`, kernel 6.12+): while datagrams stream in, the reader wakes once per
    /// `us` for a batch instead of once per datagram or two (`stel-bench e2e` at the design rate:
    /// ~13,600 wakeups/s, each also preempting whatever ran on that core). A wait that started
    /// more than `us` ago returns at the first datagram, so a quiet feed sees no added latency;
    /// a busy one at most `us`. Returns whether the kernel supports it (else waits are as before).
    pub fn set_batch_wait(&mut self, us: u32) -> bool {
        let ok = us > 0 && self.ring.params().is_feature_min_timeout();
        self.min_wait_us = if ok { us } else { 0 };
        ok
    }

    /// Returns a slot to the kernel's buffer ring (published at the next [`Self::publish`]).
    pub fn give_back(&mut self, pool: &SlotPool, slot: u16) {
        let idx = (self.tail & self.mask) as usize;
        // SAFETY: `idx <= mask < entries`, inside the allocation; the kernel only reads entries
        // between its head and the published tail, and this one is past the published tail.
        let e = unsafe { &mut *self.bufs.as_ptr().add(idx) };
        e.set_addr(pool.slot_addr(slot));
        e.set_len(self.slot_len);
        e.set_bid(slot);
        self.tail = self.tail.wrapping_add(1);
        self.in_ring += 1;
        self.pending_publish = true;
    }

    /// Publishes the new tail to the kernel (one release store per batch of give-backs).
    pub fn publish(&mut self) {
        if !self.pending_publish {
            return;
        }
        // SAFETY: `bufs` is the ring base; the tail field overlays entry 0's `resv`, which the
        // kernel reads as the tail (io_uring_buf_ring). It is a naturally aligned u16 that only
        // this thread writes; AtomicU16 has the same layout.
        let tail = unsafe {
            &*types::BufRingEntry::tail(self.bufs.as_ptr())
                .cast_mut()
                .cast::<AtomicU16>()
        };
        tail.store(self.tail, Ordering::Release);
        self.pending_publish = false;
    }

    fn arm(&mut self) -> Result<(), SysError> {
        let entry = opcode::RecvMsgMulti::new(
            types::Fd(self.fd.as_raw_fd()),
            &*self.msghdr as *const libc::msghdr,
            BUF_GROUP,
        )
        .build()
        .user_data(RECV_USER_DATA);
        // SAFETY: the SQE references `self.msghdr` (boxed, lives as long as `self`) and the
        // socket fd (owned by `self`); both outlive the request, which `Drop` cancels and reaps.
        unsafe { self.ring.submission().push(&entry) }.map_err(|_| SysError {
            call: "io_uring submission queue",
            source: std::io::Error::other("submission queue full"),
        })?;
        self.armed = true;
        Ok(())
    }

    /// Waits up to `timeout` for completions and appends one lease per complete datagram to
    /// `out`. Re-arms the multishot receive whenever the kernel ended it and slots are there.
    ///
    /// # Errors
    /// `io_uring_enter` failing with anything but a timeout or an interrupt.
    pub fn poll(
        &mut self,
        pool: &mut SlotPool,
        timeout: Duration,
        out: &mut Vec<Lease>,
        stats: &mut RecvStats,
    ) -> Result<(), SysError> {
        self.publish();
        stats.polls += 1;
        if !self.armed {
            if self.in_ring == 0 {
                stats.no_free_slot += 1;
                return Ok(());
            }
            self.arm()?;
        }
        let ts = types::Timespec::from(timeout);
        let args = types::SubmitArgs::new()
            .timespec(&ts)
            .min_wait_usec(self.min_wait_us);
        let want = if self.min_wait_us > 0 { BATCH_WANT } else { 1 };
        match self.ring.submitter().submit_with_args(want, &args) {
            Ok(_) => {}
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ETIME | libc::EINTR | libc::EBUSY)
                ) => {}
            Err(e) => return Err(uring_err("io_uring_enter", e)),
        }
        let mut rearm = false;
        // Collect first: parsing needs `pool` and `self` while the CQ is borrowed.
        let mut done: [(i32, u32); 256] = [(0, 0); 256];
        loop {
            let mut n = 0;
            for cqe in self.ring.completion().take(done.len()) {
                if cqe.user_data() == RECV_USER_DATA {
                    done[n] = (cqe.result(), cqe.flags());
                    n += 1;
                }
            }
            if n == 0 {
                break;
            }
            for &(res, flags) in &done[..n] {
                if let Some(slot) = cqueue::buffer_select(flags) {
                    self.in_ring -= 1;
                    if res >= 0 {
                        self.deliver(pool, slot, res as usize, out, stats);
                    } else {
                        self.give_back(pool, slot);
                    }
                }
                if res < 0 {
                    match -res {
                        libc::ENOBUFS => stats.rearms_no_buffers += 1,
                        _ => stats.errors += 1,
                    }
                }
                if !cqueue::more(flags) {
                    self.armed = false;
                    rearm = true;
                    if res >= 0 {
                        stats.rearms += 1;
                    }
                }
            }
        }
        self.publish();
        if rearm && self.in_ring > 0 {
            self.arm()?;
            self.ring
                .submit()
                .map_err(|e| uring_err("io_uring_enter", e))?;
        }
        Ok(())
    }

    fn deliver(
        &mut self,
        pool: &mut SlotPool,
        slot: u16,
        len: usize,
        out: &mut Vec<Lease>,
        stats: &mut RecvStats,
    ) {
        let buf = pool.filled(slot, len.min(pool.slot_len()));
        match types::RecvMsgOut::parse(buf, &self.msghdr) {
            Ok(m)
                if !m.is_payload_truncated()
                    && !m.is_control_data_truncated()
                    && m.flags() & libc::MSG_TRUNC as u32 == 0 =>
            {
                let start = buf.len() - m.payload_data().len();
                let end = buf.len();
                let seg = if self.msghdr.msg_controllen > 0 {
                    super::udp_gro_segment(m.control_data()).unwrap_or(0)
                } else {
                    0
                };
                if self.msghdr.msg_namelen > 0 {
                    let src = super::sockaddr_from_bytes(m.name_data());
                    pool.set_source(slot, src);
                }
                pool.set_segment(slot, seg);
                stats.datagrams += 1;
                stats.bytes += (end - start) as u64;
                out.push(pool.lease_filled(slot, start, end));
            }
            Ok(_) => {
                stats.truncated += 1;
                self.give_back(pool, slot);
            }
            Err(()) => {
                stats.errors += 1;
                self.give_back(pool, slot);
            }
        }
    }
}

impl Drop for UringRecv {
    fn drop(&mut self) {
        // Cancel the multishot request and reap until it is gone, so the kernel never writes a
        // slot after this point; then unregister the buffer ring and free it.
        if self.armed {
            let cancel = opcode::AsyncCancel::new(RECV_USER_DATA)
                .build()
                .user_data(CANCEL_USER_DATA);
            // SAFETY: AsyncCancel references no user memory.
            if unsafe { self.ring.submission().push(&cancel) }.is_ok() {
                let ts = types::Timespec::from(Duration::from_millis(100));
                for _ in 0..20 {
                    let args = types::SubmitArgs::new().timespec(&ts);
                    let _ = self.ring.submitter().submit_with_args(1, &args);
                    let mut finished = false;
                    for cqe in self.ring.completion() {
                        if cqe.user_data() == RECV_USER_DATA && !cqueue::more(cqe.flags()) {
                            finished = true;
                        }
                    }
                    if finished {
                        break;
                    }
                }
            }
        }
        let _ = self.ring.submitter().unregister_buf_ring(BUF_GROUP);
        // SAFETY: allocated in `new` with this layout; the group is unregistered above, and the
        // kernel drops its reference when the ring fd closes right after.
        unsafe { alloc::dealloc(self.bufs.as_ptr().cast(), self.bufs_layout) };
    }
}

/// The plain receive loop: one `recv` per datagram into a free slot.
#[derive(Debug)]
pub struct RecvLoop {
    fd: OwnedFd,
    /// Ask for each datagram's source address (`recvfrom`).
    names: bool,
    /// Read each receive's UDP GRO segment size (`recvmsg` with a control buffer).
    gro: bool,
}

impl RecvLoop {
    /// Wraps a dup of `sock`. The socket's receive timeout (SO_RCVTIMEO) bounds each wait.
    ///
    /// # Errors
    /// `dup` failing.
    pub fn new(sock: BorrowedFd<'_>, names: bool) -> Result<Self, SysError> {
        Ok(Self {
            fd: dup(sock)?,
            names,
            gro: false,
        })
    }

    /// Reads each receive's UDP GRO segment size (see [`UringRecv::want_gro_segments`]).
    pub fn want_gro_segments(&mut self) {
        self.gro = true;
    }

    /// Receives up to `max` datagrams: the first waits (up to the socket's timeout), the rest
    /// only take what is already queued.
    ///
    /// # Errors
    /// `recv` failing with anything but a timeout, interrupt or ENOBUFS.
    pub fn poll(
        &mut self,
        pool: &mut SlotPool,
        max: usize,
        out: &mut Vec<Lease>,
        stats: &mut RecvStats,
    ) -> Result<(), SysError> {
        stats.polls += 1;
        for i in 0..max {
            let Some(slot) = pool.take_free() else {
                stats.no_free_slot += 1;
                return Ok(());
            };
            let buf = pool.slot_mut(slot);
            let flags = libc::MSG_TRUNC | if i == 0 { 0 } else { libc::MSG_DONTWAIT };
            // SAFETY: sockaddr_in6 is plain old data.
            let mut name: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
            let mut name_len: libc::socklen_t = if self.names { SOCKADDR_BYTES } else { 0 };
            // Control buffer for the GRO segment size (u64 words: aligned for cmsghdr).
            let mut control = [0u64; 8];
            let mut control_len = 0usize;
            let mut ctrunc = false;
            let rc = if self.gro {
                let mut iov = libc::iovec {
                    iov_base: buf.as_mut_ptr().cast(),
                    iov_len: buf.len(),
                };
                // SAFETY: msghdr is plain old data; all-zero is empty.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                if self.names {
                    msg.msg_name = (&mut name as *mut libc::sockaddr_in6).cast();
                    msg.msg_namelen = name_len;
                }
                msg.msg_iov = &mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = std::mem::size_of_val(&control) as _;
                // SAFETY: `msg` points at `iov` (the live slot), `name` and `control`, all live
                // and writable for the call; the kernel writes at most their given lengths.
                let rc = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, flags) };
                name_len = msg.msg_namelen;
                control_len = (msg.msg_controllen as usize).min(std::mem::size_of_val(&control));
                ctrunc = msg.msg_flags & libc::MSG_CTRUNC != 0;
                rc
            } else {
                // SAFETY: `buf` is a live, writable slice owned by this thread for the call;
                // `name` is a live sockaddr_in6 of `name_len` bytes (or null with 0 when not
                // asked).
                unsafe {
                    libc::recvfrom(
                        self.fd.as_raw_fd(),
                        buf.as_mut_ptr().cast(),
                        buf.len(),
                        flags,
                        if self.names {
                            (&mut name as *mut libc::sockaddr_in6).cast()
                        } else {
                            std::ptr::null_mut()
                        },
                        if self.names {
                            &mut name_len
                        } else {
                            std::ptr::null_mut()
                        },
                    )
                }
            };
            if rc < 0 {
                pool.put_free(slot);
                let e = SysError::last("recvfrom(socket)");
                if e.is_transient() {
                    return Ok(());
                }
                stats.errors += 1;
                return Err(e);
            }
            let len = rc as usize;
            if len > pool.slot_len() || ctrunc {
                stats.truncated += 1;
                pool.put_free(slot);
                continue;
            }
            if self.gro {
                let bytes: [u8; 64] = {
                    let mut b = [0u8; 64];
                    for (k, w) in control.iter().enumerate() {
                        b[k * 8..k * 8 + 8].copy_from_slice(&w.to_ne_bytes());
                    }
                    b
                };
                let seg = super::udp_gro_segment(&bytes[..control_len]).unwrap_or(0);
                pool.set_segment(slot, seg);
            }
            if self.names {
                // SAFETY: `name` is a live sockaddr_in6; the kernel wrote `name_len` bytes of
                // it (clamped to its size), read as bytes.
                let bytes = unsafe {
                    std::slice::from_raw_parts(
                        (&name as *const libc::sockaddr_in6).cast::<u8>(),
                        (name_len as usize).min(std::mem::size_of::<libc::sockaddr_in6>()),
                    )
                };
                pool.set_source(slot, super::sockaddr_from_bytes(bytes));
            }
            stats.datagrams += 1;
            stats.bytes += len as u64;
            out.push(pool.lease_filled(slot, 0, len));
        }
        Ok(())
    }
}
