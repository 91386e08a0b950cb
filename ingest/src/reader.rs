//! The receive stage: picks io_uring (multishot `RecvMsg` + provided buffer ring) or the plain
//! `recv` loop at runtime, and hands out each datagram as a [`Lease`] on a receive slot.
//!
//! ```text
//!  socket ──▶ kernel fills a free slot ──▶ Lease(slot, range) ──▶ dispatcher ──▶ decoders
//!     ▲                                                                            │
//!     └──────────── slot back in the buffer ring / free list ◀── last lease retired┘
//! ```
//!
//! Nothing is allocated per datagram. When decoders hold every slot the receive simply pauses
//! (the kernel's socket buffer keeps filling; true drops are read from SO_MEMINFO), which is
//! how back-pressure reaches the kernel without a user-space copy.
use std::{os::fd::BorrowedFd, time::Duration};

use crate::{
    input::{FileInput, InputStats, Unit},
    netlink::UnitFraming,
    sys::{
        self,
        slots::{Lease, SlotPool, SlotView},
        uring::{RecvLoop, RecvStats, UringRecv},
        SysError,
    },
};

/// Which receive loop to use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum ReaderKind {
    /// io_uring when the kernel allows it (logged), else the recv loop.
    #[default]
    Auto,
    /// io_uring or fail.
    IoUring,
    /// Plain `recv` (the baseline; also what `auto` falls back to).
    Recvmsg,
}

/// Receive settings.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReaderConfig {
    /// `auto`, `io_uring` or `recvmsg`.
    pub kind: ReaderKind,
    /// Receive slots (= buffers in the io_uring buffer ring). Each holds one datagram. Few is
    /// faster: the ring hands buffers out round-robin, and the working set is what the kernel
    /// writes into them (slots × datagram size); measured here 32 slots of 61.5 KB datagrams
    /// (2 MiB, cache-resident) drained 6.6 GB/s where 512 (33 MiB) drained 1–3 GB/s. Running
    /// dry is not loss: the receive is re-armed and the socket buffer waits.
    pub slots: u16,
    /// Bytes per slot: the largest datagram accepted (larger ones are counted as truncated).
    /// `0` (default) = every datagram the kernel can deliver: its largest linear skb (page size
    /// << MAX_PAGE_ORDER, 4 MiB on x86-64) less `skb_shared_info`, plus the 16-byte io_uring
    /// header. A switch's genl family may bulk several 61.5 KB IPFIX messages into one skb, and
    /// io_uring's multishot receive cannot re-read a truncated datagram, so the slot must hold
    /// the largest. Only the bytes the kernel writes are touched (the region is reserved, not
    /// faulted in), so the cache working set is that of the datagrams, not of the slots
    /// (measured: docs/design.md, design notes).
    pub slot_bytes: usize,
    /// How long one wait for data may block, so shutdown and housekeeping stay responsive.
    pub poll_timeout_ms: u64,
    /// io_uring: while datagrams stream in, a wait collects them for up to this many µs and
    /// returns them together (one wakeup per batch instead of per datagram); a datagram after a
    /// quiet spell is returned at once. Adds at most this much latency under load. 0 = off;
    /// ignored by kernels before 6.12 and by the recvmsg loop.
    pub batch_wait_us: u32,
}

impl Default for ReaderConfig {
    fn default() -> Self {
        Self {
            kind: ReaderKind::Auto,
            slots: 64,
            slot_bytes: 0,
            poll_timeout_ms: 20,
            batch_wait_us: 200,
        }
    }
}

/// Bytes of `struct skb_shared_info` at the end of every skb's data (SKB_DATA_ALIGN, x86-64 and
/// arm64 with 64-byte cache lines).
const SKB_SHARED_INFO: usize = 320;
/// io_uring's `struct io_uring_recvmsg_out` before each multishot payload.
const RECVMSG_OUT: usize = 16;

/// The largest datagram the kernel can deliver on a netlink socket: the largest linear skb
/// (`alloc_skb` is limited to page size << MAX_PAGE_ORDER; MAX_PAGE_ORDER from the order
/// columns of /proc/pagetypeinfo when readable, else the default 10) less `skb_shared_info`.
pub fn kernel_max_datagram() -> usize {
    // SAFETY: sysconf takes an integer and reads no memory of ours.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = usize::try_from(page)
        .ok()
        .filter(|&p| p > 0)
        .unwrap_or(4096);
    let max_order = std::fs::read_to_string("/proc/pagetypeinfo")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.contains("at order")).map(|l| {
                l.split_whitespace()
                    .filter(|w| w.parse::<u32>().is_ok())
                    .count()
            })
        })
        .filter(|&n| (1..=20).contains(&n))
        .map_or(10, |n| n as u32 - 1);
    (page << max_order) - SKB_SHARED_INFO
}

impl ReaderConfig {
    /// The slot size in force: `slot_bytes`, or [`kernel_max_datagram`] + the io_uring header.
    pub fn effective_slot_bytes(&self) -> usize {
        if self.slot_bytes == 0 {
            kernel_max_datagram() + RECVMSG_OUT
        } else {
            self.slot_bytes
        }
    }
}

#[derive(Debug)]
enum Imp {
    /// Boxed: the ring is large and lives as long as the reader (one allocation at start).
    Uring(Box<UringRecv>),
    Recv(RecvLoop),
    /// Capture files (no socket): units are read into free slots.
    File(Box<FileReader>),
}

/// Reads units of [`FileInput`] into slots. One poll hands out units of one framing; a unit of
/// another framing waits in its slot for the next poll.
#[derive(Debug)]
struct FileReader {
    input: FileInput,
    held: Option<(u16, usize, UnitFraming)>,
    /// Capture time of the unit in each slot (pcap packets).
    capture_ns: Vec<Option<i64>>,
}

/// A running receive loop over one socket.
#[derive(Debug)]
pub struct Reader {
    pool: SlotPool,
    imp: Imp,
    stats: RecvStats,
    timeout: Duration,
    /// Framing of the units the last poll handed out.
    framing: UnitFraming,
    /// Why io_uring is not used, when it is not.
    pub fallback_reason: Option<String>,
}

impl Reader {
    /// Sets up the configured receive loop on `sock` (a netlink socket, or the local datagram
    /// socket of the demo).
    ///
    /// # Errors
    /// io_uring requested explicitly but unavailable; dup/setsockopt failing.
    pub fn new(sock: BorrowedFd<'_>, cfg: &ReaderConfig) -> Result<Self, SysError> {
        Self::with_names(sock, cfg, false)
    }

    /// As [`Self::new`] for a UDP socket: each datagram's source address is kept with its slot
    /// ([`Self::source`]); io_uring asks for it in the `RecvMsg` header, the recvmsg loop uses
    /// `recvfrom`.
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn udp(sock: BorrowedFd<'_>, cfg: &ReaderConfig) -> Result<Self, SysError> {
        Self::with_names(sock, cfg, true)
    }

    /// As [`Self::udp`], with UDP GRO turned on for the socket when the kernel has it: a lease
    /// may then hold several datagrams of one sender, each [`Self::segment`] bytes long but the
    /// last. Returns the reader and, when GRO could not be turned on, why (the reader then
    /// works as [`Self::udp`]).
    ///
    /// # Errors
    /// As [`Self::new`].
    pub fn udp_gro(
        sock: BorrowedFd<'_>,
        cfg: &ReaderConfig,
    ) -> Result<(Self, Option<String>), SysError> {
        let mut r = Self::with_names(sock, cfg, true)?;
        // The receive loop reads the segment size before the socket coalesces anything: a
        // coalesced buffer read without it would be taken for one datagram.
        match &mut r.imp {
            Imp::Uring(u) => u.want_gro_segments(),
            Imp::Recv(l) => l.want_gro_segments(),
            Imp::File(_) => return Ok((r, Some("file input".into()))),
        }
        let why = sys::set_udp_gro(sock).err().map(|e| e.to_string());
        Ok((r, why))
    }

    fn with_names(sock: BorrowedFd<'_>, cfg: &ReaderConfig, names: bool) -> Result<Self, SysError> {
        let mut pool = SlotPool::new(cfg.slots.max(2), cfg.effective_slot_bytes().max(4096));
        let timeout = Duration::from_millis(cfg.poll_timeout_ms.max(1));
        sys::set_recv_timeout(sock, timeout)?;
        let mut fallback_reason = None;
        let imp = match cfg.kind {
            ReaderKind::Recvmsg => {
                fallback_reason = Some("recvmsg requested".into());
                Imp::Recv(RecvLoop::new(sock, names)?)
            }
            ReaderKind::IoUring => {
                let mut u = UringRecv::new(sock, &mut pool, names)?;
                u.set_batch_wait(cfg.batch_wait_us);
                Imp::Uring(Box::new(u))
            }
            ReaderKind::Auto => match UringRecv::new(sock, &mut pool, names) {
                Ok(mut u) => {
                    u.set_batch_wait(cfg.batch_wait_us);
                    Imp::Uring(Box::new(u))
                }
                Err(e) => {
                    let disabled = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                        .map(|s| s.trim().to_string())
                        .unwrap_or_else(|_| "?".into());
                    let why = format!("{e} (kernel.io_uring_disabled = {disabled})");
                    tracing::warn!(reason = %why, "io_uring unavailable; using the recvmsg loop.");
                    fallback_reason = Some(why);
                    Imp::Recv(RecvLoop::new(sock, names)?)
                }
            },
        };
        Ok(Self {
            pool,
            imp,
            stats: RecvStats::default(),
            timeout,
            framing: UnitFraming::Netlink,
            fallback_reason,
        })
    }

    /// A reader over capture files instead of a socket (no privileges needed).
    pub fn files(input: FileInput, cfg: &ReaderConfig) -> Self {
        let pool = SlotPool::new(cfg.slots.max(2), cfg.effective_slot_bytes().max(4096));
        let capture_ns = vec![None; pool.slots() as usize];
        Self {
            pool,
            imp: Imp::File(Box::new(FileReader {
                input,
                held: None,
                capture_ns,
            })),
            stats: RecvStats::default(),
            timeout: Duration::from_millis(cfg.poll_timeout_ms.max(1)),
            framing: UnitFraming::Netlink,
            fallback_reason: Some("file input".into()),
        }
    }

    /// `"io_uring"`, `"recvmsg"` or `"file"`.
    pub fn kind(&self) -> &'static str {
        match self.imp {
            Imp::Uring(_) => "io_uring",
            Imp::Recv(_) => "recvmsg",
            Imp::File(_) => "file",
        }
    }

    /// Framing of the units the last [`Self::poll`] appended.
    pub fn framing(&self) -> UnitFraming {
        self.framing
    }

    /// File input: true once every file was read and handed out. Sockets: never.
    pub fn finished(&self) -> bool {
        match &self.imp {
            Imp::File(f) => f.held.is_none() && f.input.finished(),
            _ => false,
        }
    }

    /// File input counters (`None` for sockets).
    pub fn input_stats(&self) -> Option<InputStats> {
        match &self.imp {
            Imp::File(f) => Some(f.input.stats()),
            _ => None,
        }
    }

    /// File input: the files that could not be read, each with why.
    pub fn input_problems(&self) -> Vec<String> {
        match &self.imp {
            Imp::File(f) => f.input.problems().to_vec(),
            _ => Vec::new(),
        }
    }

    /// Waits (up to the poll timeout) for datagrams and appends a lease per datagram to `out`.
    ///
    /// # Errors
    /// A receive failing with anything but a timeout/interrupt/ENOBUFS.
    pub fn poll(&mut self, out: &mut Vec<Lease>) -> Result<(), SysError> {
        let starved = self.stats.no_free_slot;
        self.framing = UnitFraming::Netlink;
        let r = match &mut self.imp {
            Imp::Uring(u) => u.poll(&mut self.pool, self.timeout, out, &mut self.stats),
            Imp::Recv(r) => r.poll(&mut self.pool, 64, out, &mut self.stats),
            Imp::File(f) => {
                self.framing = f.poll(&mut self.pool, 64, out, &mut self.stats);
                Ok(())
            }
        };
        if out.is_empty() && self.stats.no_free_slot != starved {
            // Decoders hold every slot: give them the CPU instead of spinning (perf showed the
            // reader's empty polls taking 16 % of a 2-core box while decoders were busy).
            std::thread::sleep(Duration::from_micros(50));
        }
        r
    }

    /// The bytes of a lease (on the reader thread).
    pub fn bytes<'a>(&'a self, lease: &'a Lease) -> &'a [u8] {
        self.pool.bytes(lease)
    }

    /// The source address of a lease's datagram: UDP readers ([`Self::udp`]) and UDP packets
    /// of captures; `None` otherwise.
    pub fn source(&self, lease: &Lease) -> Option<std::net::SocketAddr> {
        self.pool.source(lease)
    }

    /// UDP GRO ([`Self::udp_gro`]): the size of each datagram coalesced into a lease (all but
    /// the last are this long); `None` when it holds one datagram.
    pub fn segment(&self, lease: &Lease) -> Option<usize> {
        self.pool.segment(lease)
    }

    /// When a lease's datagram was captured (units of pcap files); `None` for sockets.
    pub fn capture_ns(&self, lease: &Lease) -> Option<i64> {
        match &self.imp {
            Imp::File(f) => f.capture_ns.get(lease.slot() as usize).copied().flatten(),
            _ => None,
        }
    }

    /// A sub-range lease for a decoder.
    pub fn sublease(&mut self, of: &Lease, start: usize, end: usize) -> Lease {
        self.pool.sublease(of, start, end)
    }

    /// Ends a lease; the slot goes back to the kernel when it was the last one.
    pub fn retire(&mut self, lease: Lease) {
        match &mut self.imp {
            Imp::Uring(u) => {
                if let Some(slot) = self.pool.retire(lease) {
                    u.give_back(&self.pool, slot);
                }
            }
            Imp::Recv(_) | Imp::File(_) => self.pool.retire_to_free(lease),
        }
    }

    /// Read access to slots for decoder threads.
    pub fn view(&self) -> SlotView {
        self.pool.view()
    }

    /// Slots held by decoders or not yet dispatched.
    pub fn slots_leased(&self) -> usize {
        self.pool.leased()
    }

    /// Receive counters.
    pub fn stats(&self) -> RecvStats {
        self.stats
    }
}

impl FileReader {
    /// Reads up to `max` units of one framing into free slots; returns their framing.
    fn poll(
        &mut self,
        pool: &mut SlotPool,
        max: usize,
        out: &mut Vec<Lease>,
        stats: &mut RecvStats,
    ) -> UnitFraming {
        stats.polls += 1;
        let mut framing = None;
        if let Some((slot, len, f)) = self.held.take() {
            framing = Some(f);
            stats.datagrams += 1;
            stats.bytes += len as u64;
            out.push(pool.lease_filled(slot, 0, len));
        }
        while out.len() < max {
            let Some(slot) = pool.take_free() else {
                stats.no_free_slot += 1;
                break;
            };
            match self.input.next_unit(pool.slot_mut(slot)) {
                Some(Unit::Data { len, framing: f }) => {
                    let origin = self.input.last_origin();
                    pool.set_source(slot, origin.src);
                    self.capture_ns[slot as usize] = origin.capture_ns;
                    if framing.is_some_and(|g| g != f) {
                        self.held = Some((slot, len, f));
                        break;
                    }
                    framing = Some(f);
                    stats.datagrams += 1;
                    stats.bytes += len as u64;
                    out.push(pool.lease_filled(slot, 0, len));
                }
                Some(Unit::Nothing) => pool.put_free(slot),
                None => {
                    pool.put_free(slot);
                    break;
                }
            }
        }
        framing.unwrap_or_default()
    }
}
