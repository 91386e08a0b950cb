//! Offline input: capture files read into the same receive slots the sockets fill, so they go
//! through the same framing, filter rule, decoders and sinks, with the same counters.
//!
//! ```text
//!  IPFIX file (RFC 5655: concatenated messages) ─── one message per unit ──────┐
//!  netlink recording (u32 LE length + datagram) ─── one datagram per unit ─────┤ UnitFraming::{Ipfix, Netlink}
//!  pcap / pcapng (pcap-file crate)                                              ├──▶ reader slot ──▶ dispatch
//!     UDP (Ethernet, VLAN, SLL, SLL2, raw IP, loopback; IPv4/IPv6, reassembled) ┤     (as a socket's datagram)
//!     LINKTYPE_NETLINK (nlmon): 16-byte header + netlink datagram ──────────────┘
//!     UDP to an INT port ([int] listen ports, default 5900) ─── UnitFraming::Int ──▶ the INT
//!        decoder and sink (as a datagram of the INT sockets, with its source address and the
//!        capture time as receive time)
//! ```
//!
//! Nothing is fatal: a record that cannot be read is counted
//! ([`crate::decode::Malformed::InputRecordUnreadable`]) and skipped where the format allows
//! resynchronising (a pcap packet, a netlink record of sane length), otherwise the rest of that
//! file is counted as discarded and the next file is opened. An IPFIX file whose message header
//! is bad hands the decoder the bytes from there (up to one slot), so the decoder counts the
//! reason exactly as it would inside a netlink payload.
//!
//! `auto` format detection reads the first bytes: the pcap / pcapng magic numbers, the stel
//! recording magic ([`NETLINK_RECORDING_MAGIC`]), IPFIX version 10, else a length prefix whose
//! datagram starts with a plausible nlmsghdr.
use std::{
    collections::VecDeque,
    fs::File,
    io::{self, BufReader, Read, Write},
    path::{Path, PathBuf},
};

use pcap_file::{
    pcap::PcapReader,
    pcapng::{Block, PcapNgReader},
    DataLink,
};

use crate::{
    ipfix::{MESSAGE_HEADER_LEN, VERSION},
    netlink::{UnitFraming, NLMSG_HDRLEN},
};

/// First 8 bytes of a netlink recording written by `stel-emu --record` (then, per datagram, its
/// length as u32 little-endian and its bytes). Files without it (a bare length-prefixed stream)
/// are read the same way.
pub const NETLINK_RECORDING_MAGIC: &[u8; 8] = b"STELNL\x00\x01";

/// How to read an input file.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum InputFormat {
    /// From the file's first bytes.
    #[default]
    Auto,
    /// Concatenated IPFIX messages (RFC 5655 file, `stel-emu --file`).
    Ipfix,
    /// Netlink datagrams, each after a u32 little-endian length (`stel-emu --record`).
    Netlink,
    /// pcap or pcapng: UDP-carried IPFIX on any port, or LINKTYPE_NETLINK (nlmon) captures.
    Pcap,
}

/// What file input counts (besides what the decoders count).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct InputStats {
    /// Files opened.
    pub files: u64,
    /// Files that could not be opened or recognised (logged).
    pub files_failed: u64,
    /// Bytes read from files.
    pub bytes_read: u64,
    /// Units handed to the pipeline (IPFIX messages, netlink datagrams, UDP payloads).
    pub units: u64,
    /// Records that could not be read (counted as malformed `input_record_unreadable`).
    pub unreadable_records: u64,
    /// Bytes given up on (the rest of a file after an unreadable record that cannot be
    /// skipped, or past one slot after a bad IPFIX header).
    pub discarded_bytes: u64,
    /// Capture packets that are not UDP/IP or netlink (ARP, TCP, …): skipped, not malformed.
    pub skipped_packets: u64,
    /// UDP payloads that neither go to an INT port nor start with IPFIX version 10 (other
    /// protocols on the wire): skipped.
    pub non_ipfix_datagrams: u64,
    /// UDP payloads to an INT port, handed to the INT decoder (which counts what it makes of
    /// them).
    pub int_datagrams: u64,
    /// IP fragments held for reassembly, and datagrams reassembled from them.
    pub ip_fragments: u64,
    pub ip_reassembled: u64,
    /// Fragments dropped unassembled (incomplete when the table was full or the file ended).
    pub ip_fragments_dropped: u64,
}

/// One unit read into the caller's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// `len` bytes of the given framing.
    Data { len: usize, framing: UnitFraming },
    /// Nothing this time (a skipped record, a fragment held): ask again.
    Nothing,
}

enum Open {
    Ipfix(BufReader<File>),
    Netlink(BufReader<File>),
    Pcap(Box<PcapReader<BufReader<File>>>),
    /// With the link types of the section's interfaces, in order (their IDs).
    PcapNg(Box<PcapNgReader<BufReader<File>>>, Vec<DataLink>),
}

/// Where the last UDP unit came from (capture packets only).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Origin {
    /// The sender's address and port (IP source, UDP source port).
    pub src: Option<std::net::SocketAddr>,
    /// The capture timestamp, ns since the epoch.
    pub capture_ns: Option<i64>,
}

/// Reads a list of files, in order, unit by unit (see the module docs).
pub struct FileInput {
    files: VecDeque<PathBuf>,
    format: InputFormat,
    cur: Option<(PathBuf, Open)>,
    stats: InputStats,
    defrag: Defrag,
    /// UDP destination ports whose datagrams are INT reports.
    int_ports: Vec<u16>,
    origin: Origin,
    /// Files that could not be read, with why (one entry per file at most).
    problems: Vec<String>,
}

impl std::fmt::Debug for FileInput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileInput")
            .field("files", &self.files)
            .field("current", &self.cur.as_ref().map(|c| &c.0))
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

/// Detects a file's format from its first bytes.
///
/// # Errors
/// The file cannot be read, or its start matches no format (the message names the bytes).
pub fn detect(path: &Path) -> io::Result<InputFormat> {
    let mut head = [0u8; 16];
    let mut f = File::open(path)?;
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..])? {
            0 => break,
            k => n += k,
        }
    }
    if n == 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "empty file"));
    }
    Ok(detect_bytes(&head[..n]).unwrap_or(InputFormat::Auto))
}

/// [`detect`] on the first (up to) 16 bytes; `None` when nothing matches.
pub fn detect_bytes(head: &[u8]) -> Option<InputFormat> {
    let w = |i: usize| head.get(i..i + 4).map(|b| [b[0], b[1], b[2], b[3]]);
    match w(0) {
        Some([0xd4, 0xc3, 0xb2, 0xa1] | [0xa1, 0xb2, 0xc3, 0xd4])
        | Some([0x4d, 0x3c, 0xb2, 0xa1] | [0xa1, 0xb2, 0x3c, 0x4d])
        | Some([0x0a, 0x0d, 0x0d, 0x0a]) => return Some(InputFormat::Pcap),
        _ => {}
    }
    if head.starts_with(NETLINK_RECORDING_MAGIC) {
        return Some(InputFormat::Netlink);
    }
    if head.len() >= 4 && u16::from_be_bytes([head[0], head[1]]) == VERSION {
        let len = u16::from_be_bytes([head[2], head[3]]) as usize;
        if len >= MESSAGE_HEADER_LEN {
            return Some(InputFormat::Ipfix);
        }
    }
    if let (Some(l), Some(nl)) = (w(0), w(4)) {
        let (l, nl) = (
            u32::from_le_bytes(l) as usize,
            u32::from_le_bytes(nl) as usize,
        );
        if l >= NLMSG_HDRLEN && (NLMSG_HDRLEN..=l).contains(&nl) {
            return Some(InputFormat::Netlink);
        }
    }
    None
}

impl FileInput {
    /// Reads `files` in order, each in `format` (`Auto`: detected per file).
    pub fn new(files: Vec<PathBuf>, format: InputFormat) -> Self {
        Self {
            files: files.into(),
            format,
            cur: None,
            stats: InputStats::default(),
            defrag: Defrag::default(),
            int_ports: Vec::new(),
            origin: Origin::default(),
            problems: Vec::new(),
        }
    }

    /// The files that could not be read, each with why (`path: reason`).
    pub fn problems(&self) -> &[String] {
        &self.problems
    }

    /// UDP datagrams of captures to these destination ports are INT reports
    /// ([`UnitFraming::Int`]) instead of IPFIX.
    #[must_use]
    pub fn with_int_ports(mut self, ports: Vec<u16>) -> Self {
        self.int_ports = ports;
        self
    }

    /// Sender and capture time of the unit [`Self::next_unit`] returned last (capture packets;
    /// empty for other formats).
    pub fn last_origin(&self) -> Origin {
        self.origin
    }

    /// Counters.
    pub fn stats(&self) -> InputStats {
        self.stats
    }

    /// True when every file was read to its end.
    pub fn finished(&self) -> bool {
        self.cur.is_none() && self.files.is_empty()
    }

    fn open_next(&mut self) -> bool {
        while let Some(path) = self.files.pop_front() {
            match self.open(&path) {
                Ok(o) => {
                    self.stats.files += 1;
                    self.defrag.clear(&mut self.stats);
                    tracing::info!(file = %path.display(), "Reading input file.");
                    self.cur = Some((path, o));
                    return true;
                }
                Err(e) => {
                    self.stats.files_failed += 1;
                    tracing::error!(file = %path.display(), error = %e, "Cannot read input file; skipped.");
                    self.problems.push(format!("{}: {e}", path.display()));
                }
            }
        }
        false
    }

    fn open(&mut self, path: &Path) -> io::Result<Open> {
        let format = match self.format {
            InputFormat::Auto => detect(path)?,
            f => f,
        };
        let r = BufReader::with_capacity(1 << 20, File::open(path)?);
        let bad =
            |e: pcap_file::PcapError| io::Error::new(io::ErrorKind::InvalidData, e.to_string());
        Ok(match format {
            InputFormat::Ipfix => Open::Ipfix(r),
            InputFormat::Netlink => {
                let mut r = r;
                let mut magic = [0u8; 8];
                let n = read_full(&mut r, &mut magic)?;
                if n < 8 || &magic != NETLINK_RECORDING_MAGIC {
                    // A bare length-prefixed stream: start over.
                    r = BufReader::with_capacity(1 << 20, File::open(path)?);
                } else {
                    self.stats.bytes_read += 8;
                }
                Open::Netlink(r)
            }
            InputFormat::Pcap => {
                let mut head = [0u8; 4];
                File::open(path)?.read_exact(&mut head)?;
                if head == [0x0a, 0x0d, 0x0d, 0x0a] {
                    Open::PcapNg(Box::new(PcapNgReader::new(r).map_err(bad)?), Vec::new())
                } else {
                    Open::Pcap(Box::new(PcapReader::new(r).map_err(bad)?))
                }
            }
            InputFormat::Auto => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "not an IPFIX file, netlink recording, pcap or pcapng (pass --input-format)",
                ))
            }
        })
    }

    /// Reads the next unit into `buf`. `None` when every file is done.
    pub fn next_unit(&mut self, buf: &mut [u8]) -> Option<Unit> {
        if self.cur.is_none() && !self.open_next() {
            return None;
        }
        let (path, open) = self.cur.as_mut().expect("opened above");
        self.origin = Origin::default();
        let origin = &mut self.origin;
        let int_ports = &self.int_ports[..];
        let r = match open {
            Open::Ipfix(r) => ipfix_unit(r, buf, &mut self.stats),
            Open::Netlink(r) => netlink_unit(r, buf, &mut self.stats),
            Open::Pcap(r) => {
                let link = r.header().datalink;
                let nanos = r.header().ts_resolution == pcap_file::TsResolution::NanoSecond;
                // Raw records: the validated ones refuse a packet longer than the file's snap
                // length, which real captures of large datagrams have.
                match r.next_raw_packet() {
                    None => Ok(None),
                    Some(Err(e)) => Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string())),
                    Some(Ok(p)) => {
                        self.stats.bytes_read += p.data.len() as u64 + 16;
                        let complete = p.data.len() as u64 == u64::from(p.orig_len)
                            && p.incl_len as usize == p.data.len();
                        let frac = if nanos {
                            i64::from(p.ts_frac)
                        } else {
                            i64::from(p.ts_frac) * 1000
                        };
                        origin.capture_ns = Some(i64::from(p.ts_sec) * 1_000_000_000 + frac);
                        Ok(Some(packet_unit(
                            link,
                            &p.data,
                            complete,
                            buf,
                            &mut self.stats,
                            &mut self.defrag,
                            int_ports,
                            origin,
                        )))
                    }
                }
            }
            Open::PcapNg(r, links) => loop {
                match r.next_block() {
                    None => break Ok(None),
                    Some(Err(e)) => {
                        break Err(io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
                    }
                    Some(Ok(Block::EnhancedPacket(p))) => {
                        self.stats.bytes_read += p.data.len() as u64 + 32;
                        let Some(&link) = links.get(p.interface_id as usize) else {
                            self.stats.unreadable_records += 1;
                            break Ok(Some(Unit::Nothing));
                        };
                        let complete = p.data.len() as u64 == u64::from(p.original_len);
                        origin.capture_ns = i64::try_from(p.timestamp.as_nanos()).ok();
                        break Ok(Some(packet_unit(
                            link,
                            &p.data,
                            complete,
                            buf,
                            &mut self.stats,
                            &mut self.defrag,
                            int_ports,
                            origin,
                        )));
                    }
                    Some(Ok(Block::SimplePacket(p))) => {
                        self.stats.bytes_read += p.data.len() as u64 + 16;
                        let Some(&link) = links.first() else {
                            self.stats.unreadable_records += 1;
                            break Ok(Some(Unit::Nothing));
                        };
                        let complete = p.data.len() as u64 == u64::from(p.original_len);
                        break Ok(Some(packet_unit(
                            link,
                            &p.data,
                            complete,
                            buf,
                            &mut self.stats,
                            &mut self.defrag,
                            int_ports,
                            origin,
                        )));
                    }
                    Some(Ok(Block::InterfaceDescription(i))) => links.push(i.linktype),
                    Some(Ok(Block::SectionHeader(_))) => links.clear(),
                    Some(Ok(_)) => {} // statistics, name resolution, …
                }
            },
        };
        match r {
            Ok(Some(u)) => {
                if matches!(u, Unit::Data { .. }) {
                    self.stats.units += 1;
                }
                Some(u)
            }
            Ok(None) => {
                tracing::info!(file = %path.display(), "Input file done.");
                self.cur = None;
                self.defrag.clear(&mut self.stats);
                Some(Unit::Nothing)
            }
            Err(e) => {
                // The format cannot be followed past this point: count it, give up the rest.
                self.stats.unreadable_records += 1;
                if let Ok(left) = remaining(open) {
                    self.stats.discarded_bytes += left;
                }
                tracing::warn!(file = %path.display(), error = %e, "Unreadable record; the rest of the file is skipped.");
                self.cur = None;
                self.defrag.clear(&mut self.stats);
                Some(Unit::Nothing)
            }
        }
    }
}

/// Bytes left in the open file (for the discarded count).
fn remaining(open: &mut Open) -> io::Result<u64> {
    let mut sink = io::sink();
    match open {
        Open::Ipfix(r) | Open::Netlink(r) => io::copy(r, &mut sink),
        Open::Pcap(_) | Open::PcapNg(..) => Ok(0),
    }
}

fn read_full(r: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// One IPFIX message; a header that cannot be trusted hands over the rest (up to `buf`) and
/// ends the file.
fn ipfix_unit(
    r: &mut BufReader<File>,
    buf: &mut [u8],
    stats: &mut InputStats,
) -> io::Result<Option<Unit>> {
    let cap = buf.len();
    let n = read_full(r, &mut buf[..MESSAGE_HEADER_LEN.min(cap)])?;
    if n == 0 {
        return Ok(None);
    }
    stats.bytes_read += n as u64;
    let h = &buf[..n];
    let len = if n == MESSAGE_HEADER_LEN && u16::from_be_bytes([h[0], h[1]]) == VERSION {
        u16::from_be_bytes([h[2], h[3]]) as usize
    } else {
        0
    };
    if len >= MESSAGE_HEADER_LEN && len <= cap {
        let m = read_full(r, &mut buf[n..len])?;
        stats.bytes_read += m as u64;
        // A message cut short by the end of the file goes as it is (the decoder counts
        // message_past_buffer).
        return Ok(Some(Unit::Data {
            len: n + m,
            framing: UnitFraming::Ipfix,
        }));
    }
    // Not a header: no next message can be found. The decoder sees (and counts) what follows.
    let m = read_full(r, &mut buf[n..])?;
    stats.bytes_read += m as u64;
    if n + m == cap {
        let rest = io::copy(r, &mut io::sink())?;
        stats.bytes_read += rest;
        stats.discarded_bytes += rest;
    }
    // Ends this file: the next call sees EOF.
    Ok(Some(Unit::Data {
        len: n + m,
        framing: UnitFraming::Ipfix,
    }))
}

/// One length-prefixed netlink datagram. A length past the slot is skipped (counted); a record
/// cut short ends the file (counted).
fn netlink_unit(
    r: &mut BufReader<File>,
    buf: &mut [u8],
    stats: &mut InputStats,
) -> io::Result<Option<Unit>> {
    let mut l = [0u8; 4];
    let n = read_full(r, &mut l)?;
    if n == 0 {
        return Ok(None);
    }
    stats.bytes_read += n as u64;
    if n < 4 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "a cut length prefix",
        ));
    }
    let len = u32::from_le_bytes(l) as usize;
    if len > buf.len() {
        let skipped = io::copy(&mut r.by_ref().take(len as u64), &mut io::sink())?;
        stats.bytes_read += skipped;
        stats.discarded_bytes += skipped;
        stats.unreadable_records += 1;
        tracing::warn!(
            len,
            slot = buf.len(),
            "Netlink record larger than a receive slot; skipped."
        );
        return Ok(Some(Unit::Nothing));
    }
    let m = read_full(r, &mut buf[..len])?;
    stats.bytes_read += m as u64;
    if m < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("a {len}-byte record cut after {m} bytes"),
        ));
    }
    Ok(Some(Unit::Data {
        len,
        framing: UnitFraming::Netlink,
    }))
}

/// One capture packet → a netlink datagram or a UDP payload in `buf` (an INT report when its
/// destination port is one of `int_ports`; its sender goes to `origin`).
#[allow(clippy::too_many_arguments)]
fn packet_unit(
    link: DataLink,
    pkt: &[u8],
    complete: bool,
    buf: &mut [u8],
    stats: &mut InputStats,
    defrag: &mut Defrag,
    int_ports: &[u16],
    origin: &mut Origin,
) -> Unit {
    if !complete {
        // Cut by the capture's snap length: the payload is not all there.
        stats.unreadable_records += 1;
        return Unit::Nothing;
    }
    let (l3, framing): (Option<(&[u8], u16)>, _) = match link {
        DataLink::NETLINK => {
            // 16-byte header (ARPHRD_NETLINK, protocol), then the netlink datagram.
            return match pkt.get(16..) {
                Some(d) if d.len() <= buf.len() => {
                    buf[..d.len()].copy_from_slice(d);
                    Unit::Data {
                        len: d.len(),
                        framing: UnitFraming::Netlink,
                    }
                }
                _ => {
                    stats.unreadable_records += 1;
                    Unit::Nothing
                }
            };
        }
        DataLink::ETHERNET => (ethernet(pkt), UnitFraming::Ipfix),
        DataLink::LINUX_SLL => (
            pkt.get(16..)
                .map(|p| (p, u16::from_be_bytes([pkt[14], pkt[15]]))),
            UnitFraming::Ipfix,
        ),
        DataLink::LINUX_SLL2 => (
            pkt.get(20..)
                .map(|p| (p, u16::from_be_bytes([pkt[0], pkt[1]]))),
            UnitFraming::Ipfix,
        ),
        DataLink::RAW | DataLink::IPV4 | DataLink::IPV6 => (
            pkt.first().map(|v| (pkt, ip_ethertype(*v))),
            UnitFraming::Ipfix,
        ),
        DataLink::NULL | DataLink::LOOP => (
            pkt.get(4..)
                .map(|p| (p, p.first().map_or(0, |v| ip_ethertype(*v)))),
            UnitFraming::Ipfix,
        ),
        _ => {
            stats.skipped_packets += 1;
            return Unit::Nothing;
        }
    };
    let Some((l3, ethertype)) = l3 else {
        stats.unreadable_records += 1;
        return Unit::Nothing;
    };
    let udp = match ethertype {
        0x0800 => ipv4(l3, stats, defrag),
        0x86dd => ipv6(l3, stats, defrag),
        _ => {
            stats.skipped_packets += 1;
            return Unit::Nothing;
        }
    };
    let udp = match udp {
        Ip::Udp(p) => p,
        Ip::Held => return Unit::Nothing,
        Ip::NotUdp => {
            stats.skipped_packets += 1;
            return Unit::Nothing;
        }
        Ip::Bad => {
            stats.unreadable_records += 1;
            return Unit::Nothing;
        }
    };
    // udp_payload checked the 8-byte header.
    let Some(payload) = udp_payload(&udp) else {
        stats.unreadable_records += 1;
        return Unit::Nothing;
    };
    let dst_port = u16::from_be_bytes([udp[2], udp[3]]);
    if int_ports.contains(&dst_port) {
        if payload.len() > buf.len() {
            stats.unreadable_records += 1;
            return Unit::Nothing;
        }
        origin.src = ip_source(l3)
            .map(|a| std::net::SocketAddr::new(a, u16::from_be_bytes([udp[0], udp[1]])));
        stats.int_datagrams += 1;
        buf[..payload.len()].copy_from_slice(payload);
        return Unit::Data {
            len: payload.len(),
            framing: UnitFraming::Int,
        };
    }
    if payload.len() < 2 || u16::from_be_bytes([payload[0], payload[1]]) != VERSION {
        stats.non_ipfix_datagrams += 1;
        return Unit::Nothing;
    }
    if payload.len() > buf.len() {
        stats.unreadable_records += 1;
        return Unit::Nothing;
    }
    buf[..payload.len()].copy_from_slice(payload);
    Unit::Data {
        len: payload.len(),
        framing,
    }
}

/// The source address of an IPv4/IPv6 header (checked by [`ipv4`] / [`ipv6`] before).
fn ip_source(l3: &[u8]) -> Option<std::net::IpAddr> {
    match l3.first()? >> 4 {
        4 => Some(<[u8; 4]>::try_from(l3.get(12..16)?).ok()?.into()),
        6 => Some(<[u8; 16]>::try_from(l3.get(8..24)?).ok()?.into()),
        _ => None,
    }
}

fn ip_ethertype(first: u8) -> u16 {
    match first >> 4 {
        4 => 0x0800,
        6 => 0x86dd,
        _ => 0,
    }
}

/// Ethernet II with up to two VLAN tags → (L3 bytes, ethertype).
fn ethernet(p: &[u8]) -> Option<(&[u8], u16)> {
    let mut off = 12;
    let mut ty = u16::from_be_bytes([*p.get(off)?, *p.get(off + 1)?]);
    for _ in 0..2 {
        if ty == 0x8100 || ty == 0x88a8 {
            off += 4;
            ty = u16::from_be_bytes([*p.get(off)?, *p.get(off + 1)?]);
        }
    }
    Some((p.get(off + 2..)?, ty))
}

/// A UDP datagram's payload (checked against the UDP length).
fn udp_payload(udp: &[u8]) -> Option<&[u8]> {
    let len = u16::from_be_bytes([*udp.get(4)?, *udp.get(5)?]) as usize;
    if len < 8 || len > udp.len() {
        return None;
    }
    Some(&udp[8..len])
}

enum Ip<'a> {
    /// The whole UDP datagram (header included): borrowed, or reassembled from fragments.
    Udp(std::borrow::Cow<'a, [u8]>),
    /// A fragment kept for reassembly.
    Held,
    NotUdp,
    Bad,
}

fn ipv4<'a>(p: &'a [u8], stats: &mut InputStats, defrag: &mut Defrag) -> Ip<'a> {
    if p.len() < 20 || p[0] >> 4 != 4 {
        return Ip::Bad;
    }
    let ihl = (p[0] & 15) as usize * 4;
    let total = u16::from_be_bytes([p[2], p[3]]) as usize;
    if ihl < 20 || total < ihl || total > p.len() {
        return Ip::Bad;
    }
    if p[9] != 17 {
        return Ip::NotUdp;
    }
    let flags_frag = u16::from_be_bytes([p[6], p[7]]);
    let more = flags_frag & 0x2000 != 0;
    let offset = (flags_frag & 0x1fff) as usize * 8;
    let body = &p[ihl..total];
    if !more && offset == 0 {
        return Ip::Udp(body.into());
    }
    let mut key = [0u8; 36];
    key[..4].copy_from_slice(&p[12..16]);
    key[16..20].copy_from_slice(&p[16..20]);
    key[32..34].copy_from_slice(&p[4..6]);
    defrag.add(key, offset, more, body, stats)
}

fn ipv6<'a>(p: &'a [u8], stats: &mut InputStats, defrag: &mut Defrag) -> Ip<'a> {
    if p.len() < 40 || p[0] >> 4 != 6 {
        return Ip::Bad;
    }
    let plen = u16::from_be_bytes([p[4], p[5]]) as usize;
    if 40 + plen > p.len() {
        return Ip::Bad;
    }
    let mut next = p[6];
    let mut off = 40;
    let end = 40 + plen;
    // Extension headers: hop-by-hop (0), routing (43), destination options (60), fragment (44).
    for _ in 0..8 {
        match next {
            17 => return Ip::Udp(p[off..end].into()),
            0 | 43 | 60 => {
                let (Some(&nh), Some(&l)) = (p.get(off), p.get(off + 1)) else {
                    return Ip::Bad;
                };
                next = nh;
                off += (l as usize + 1) * 8;
                if off > end {
                    return Ip::Bad;
                }
            }
            44 => {
                let Some(h) = p.get(off..off + 8) else {
                    return Ip::Bad;
                };
                if h[0] != 17 {
                    return Ip::NotUdp;
                }
                let fo = u16::from_be_bytes([h[2], h[3]]);
                let offset = (fo & 0xfff8) as usize;
                let more = fo & 1 != 0;
                let mut key = [0u8; 36];
                key[..16].copy_from_slice(&p[8..24]);
                key[16..32].copy_from_slice(&p[24..40]);
                key[32..36].copy_from_slice(&h[4..8]);
                return defrag.add(key, offset, more, &p[off + 8..end], stats);
            }
            _ => return Ip::NotUdp,
        }
    }
    Ip::Bad
}

/// IP fragment reassembly: at most [`Defrag::MAX`] datagrams in progress, each at most 64 KiB +
/// its last fragment; the oldest incomplete one is dropped (counted) when the table is full.
#[derive(Debug, Default)]
struct Defrag {
    pending: VecDeque<Reassembly>,
}

/// (source, destination, ID) key; (offset, bytes) pieces; total length once the last piece is
/// in.
type Reassembly = ([u8; 36], Vec<(usize, Vec<u8>)>, Option<usize>);

impl Defrag {
    const MAX: usize = 64;
    const MAX_LEN: usize = 65535 + 8;

    fn clear(&mut self, stats: &mut InputStats) {
        for (_, pieces, _) in self.pending.drain(..) {
            stats.ip_fragments_dropped += pieces.len() as u64;
        }
    }

    fn add(
        &mut self,
        key: [u8; 36],
        offset: usize,
        more: bool,
        body: &[u8],
        stats: &mut InputStats,
    ) -> Ip<'static> {
        stats.ip_fragments += 1;
        if offset + body.len() > Self::MAX_LEN {
            return Ip::Bad;
        }
        let i = match self.pending.iter().position(|(k, ..)| *k == key) {
            Some(i) => i,
            None => {
                if self.pending.len() == Self::MAX {
                    if let Some((_, pieces, _)) = self.pending.pop_front() {
                        stats.ip_fragments_dropped += pieces.len() as u64;
                    }
                }
                self.pending.push_back((key, Vec::new(), None));
                self.pending.len() - 1
            }
        };
        let entry = &mut self.pending[i];
        entry.1.push((offset, body.to_vec()));
        if !more {
            entry.2 = Some(offset + body.len());
        }
        let Some(total) = entry.2 else {
            return Ip::Held;
        };
        entry.1.sort_by_key(|(o, _)| *o);
        let mut have = 0;
        for (o, b) in &entry.1 {
            if *o > have {
                return Ip::Held; // a hole
            }
            have = have.max(o + b.len());
        }
        if have < total {
            return Ip::Held;
        }
        let (_, pieces, _) = self.pending.remove(i).expect("index from position");
        let mut out = vec![0u8; total];
        for (o, b) in pieces {
            let end = (o + b.len()).min(total);
            out[o..end].copy_from_slice(&b[..end - o]);
        }
        stats.ip_reassembled += 1;
        Ip::Udp(out.into())
    }
}

/// Writes a netlink recording (what [`FileInput`] reads as [`InputFormat::Netlink`]).
#[derive(Debug)]
pub struct NetlinkRecorder<W: Write> {
    w: W,
}

impl<W: Write> NetlinkRecorder<W> {
    /// Writes the header.
    ///
    /// # Errors
    /// The write failing.
    pub fn new(mut w: W) -> io::Result<Self> {
        w.write_all(NETLINK_RECORDING_MAGIC)?;
        Ok(Self { w })
    }

    /// Appends one datagram.
    ///
    /// # Errors
    /// The write failing, or a datagram over 4 GiB.
    pub fn record(&mut self, datagram: &[u8]) -> io::Result<()> {
        let len = u32::try_from(datagram.len())
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "datagram over 4 GiB"))?;
        self.w.write_all(&len.to_le_bytes())?;
        self.w.write_all(datagram)
    }

    /// Flushes and returns the writer.
    ///
    /// # Errors
    /// The flush failing.
    pub fn finish(mut self) -> io::Result<W> {
        self.w.flush()?;
        Ok(self.w)
    }
}

#[cfg(test)]
mod tests;
