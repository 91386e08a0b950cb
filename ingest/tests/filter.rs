//! The template filter through the real kernel: the eBPF socket filter built by `build.rs`,
//! attached to a NETLINK_USERSOCK socket, fed by stel-emu's encoder over multicast.
//!
//! Needs root (USERSOCK multicast, CAP_BPF) and the eBPF toolchain (the README's test command
//! installs it): the kernel tests FAIL, never skip, without either. The user-space fallback test
//! runs either way.
//!
//! Multicast delivery is synchronous: when `sendto` returns, the datagram is in every member's
//! receive queue or was dropped by its filter, so each test reads until the queue is empty and
//! compares exactly. Groups 20..=27 are this file's.
use std::{
    os::{fd::AsFd, unix::fs::MetadataExt},
    time::Duration,
};
use stel_emu::{EmuConfig, Emulator, Encoder, HftField, HftTemplate};

use stel_ingest::{
    decode::{CounterBatch, DecodeConfig, Decoder},
    filter::{datagram_verdict, FilterStats, TemplateFilter, TemplateSet, Verdict},
    ipfix::SeqMode,
    netlink::{self, FrameErrors, USERSOCK_MSG_TYPE},
    sys::netlink::NetlinkSocket,
};

/// The kernel filter, or a loud failure saying why it is missing.
fn kernel_filter() -> TemplateFilter {
    TemplateFilter::kernel().unwrap_or_else(|e| {
        panic!(
            "the eBPF socket filter is required for these tests (run them as root, after \
             deploy/setup.sh installed the eBPF toolchain): {e}"
        )
    })
}

fn rx_socket(group: u32, rcvbuf: usize) -> NetlinkSocket {
    let rx = NetlinkSocket::usersock().expect("NETLINK_USERSOCK socket (run the tests as root)");
    rx.set_rcvbuf(rcvbuf).expect("rcvbuf");
    rx.set_recv_timeout(Duration::from_millis(50))
        .expect("timeout");
    rx.join_group(group)
        .expect("join multicast group (run the tests as root)");
    rx
}

fn tx_socket() -> NetlinkSocket {
    let tx = NetlinkSocket::usersock().expect("sender socket");
    tx.set_sndbuf(4 << 20).expect("sndbuf");
    tx
}

/// Everything queued on `rx`, in order (reads until the receive timeout).
fn drain(rx: &NetlinkSocket) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 17];
    loop {
        match rx.recv(&mut buf) {
            Ok((n, real)) => {
                assert_eq!(n, real, "no truncation with a 128 KiB buffer");
                out.push(buf[..n].to_vec());
            }
            Err(e) if e.is_transient() => return out,
            Err(e) => panic!("{e}"),
        }
    }
}

fn framed(seq: u32, payload: &[u8]) -> Vec<u8> {
    let mut d = Vec::new();
    netlink::frame(&mut d, USERSOCK_MSG_TYPE, seq, payload);
    d
}

/// The netlink sequence number of a datagram's first message.
fn seq_of(d: &[u8]) -> u32 {
    u32::from_ne_bytes(d[8..12].try_into().unwrap())
}

fn emulator(template_id: u16) -> Emulator {
    let mut cfg = EmuConfig::design();
    cfg.ports = 4;
    cfg.template_id = template_id;
    cfg.snapshots_per_message = 10;
    Emulator::new(cfg).unwrap()
}

/// (Rmem, Drops) of the socket behind `fd`, from /proc/net/netlink (matched by inode).
fn proc_rmem_drops(sock: &NetlinkSocket) -> (u64, u64) {
    let fd = sock.as_fd();
    let ino = std::fs::metadata(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ))
    .expect("stat socket fd")
    .ino();
    let table = std::fs::read_to_string("/proc/net/netlink").expect("/proc/net/netlink");
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() >= 10 && f[9].parse::<u64>().ok() == Some(ino) {
            return (f[4].parse().unwrap(), f[8].parse().unwrap());
        }
    }
    panic!("socket inode {ino} not in /proc/net/netlink");
}

#[test]
fn keeps_and_drops_as_the_map_changes_live() {
    let group = 20;
    let rx = rx_socket(group, 64 << 20);
    let tx = tx_socket();
    let mut f = kernel_filter();
    assert!(f.is_kernel());
    f.attach(rx.as_fd()).expect("attach");
    let mut emu = emulator(256);
    let mut ipfix = Vec::new();
    let mut seq = 0u32;
    let mut send = |emu: &mut Emulator, template: bool| {
        ipfix.clear();
        if template {
            emu.template_message(&mut ipfix);
        } else {
            emu.data_message(&mut ipfix);
        }
        seq += 1;
        tx.send_multicast(group, &framed(seq, &ipfix))
            .expect("send");
        seq
    };
    // Nothing registered: the template is kept, data dropped.
    let mut expect = vec![send(&mut emu, true)];
    for _ in 0..5 {
        send(&mut emu, false);
    }
    // Registered: kept, live.
    f.register(256).unwrap();
    for _ in 0..5 {
        expect.push(send(&mut emu, false));
    }
    // Another template registered, 256 withdrawn: dropped again.
    f.register(999).unwrap();
    f.unregister(256).unwrap();
    for _ in 0..5 {
        send(&mut emu, false);
    }
    // Registered again.
    f.register(256).unwrap();
    expect.push(send(&mut emu, false));

    let got = drain(&rx);
    assert_eq!(got.iter().map(|d| seq_of(d)).collect::<Vec<_>>(), expect);
    assert_eq!(
        f.stats().unwrap(),
        FilterStats {
            seen: 17,
            kept: 7,
            dropped: 10,
            too_short: 0,
            learned: 0,
            learn_failed: 0,
            last_dropped_set_id: f.stats().unwrap().last_dropped_set_id,
        }
    );
    assert_eq!(rx.drops().unwrap(), 0);
    // The kept messages decode completely.
    let mut d = Decoder::new(DecodeConfig::default());
    let mut rows = 0;
    let mut ferr = FrameErrors::default();
    for dg in &got {
        netlink::for_each_payload(dg, &mut ferr, |p| {
            d.decode(p, &mut |b: CounterBatch| rows += b.rows());
        });
    }
    d.flush(&mut |b: CounterBatch| rows += b.rows());
    assert_eq!(rows, 6 * emu.snapshots_per_message());
    assert_eq!(d.stats().unknown_template_bytes, 0);
    assert_eq!(ferr, FrameErrors::default());
}

#[test]
fn data_before_its_template_is_kept_when_registered_and_counted_by_the_decoder() {
    let group = 21;
    let rx = rx_socket(group, 64 << 20);
    let tx = tx_socket();
    let mut f = kernel_filter();
    f.attach(rx.as_fd()).unwrap();
    f.register(300).unwrap();
    let mut emu = emulator(300);
    let mut ipfix = Vec::new();
    // Data first: the filter keeps it (300 is registered); the decoder has no template yet.
    emu.data_message(&mut ipfix);
    tx.send_multicast(group, &framed(1, &ipfix)).unwrap();
    let early_len = ipfix.len();
    ipfix.clear();
    emu.template_message(&mut ipfix);
    tx.send_multicast(group, &framed(2, &ipfix)).unwrap();
    ipfix.clear();
    emu.data_message(&mut ipfix);
    tx.send_multicast(group, &framed(3, &ipfix)).unwrap();

    let got = drain(&rx);
    assert_eq!(got.iter().map(|d| seq_of(d)).collect::<Vec<_>>(), [1, 2, 3]);
    let mut d = Decoder::new(DecodeConfig::default());
    let mut rows = 0;
    let mut ferr = FrameErrors::default();
    for dg in &got {
        netlink::for_each_payload(dg, &mut ferr, |p| {
            d.decode(p, &mut |b: CounterBatch| rows += b.rows());
        });
    }
    d.flush(&mut |b: CounterBatch| rows += b.rows());
    assert_eq!(
        rows,
        emu.snapshots_per_message(),
        "only the data after the template"
    );
    // The early data set's body (message minus IPFIX and set headers) counted as unknown.
    assert_eq!(
        d.stats().unknown_template_bytes,
        (early_len - 16 - 4) as u64
    );
    assert_eq!(
        f.stats().unwrap(),
        FilterStats {
            seen: 3,
            kept: 3,
            dropped: 0,
            too_short: 0,
            learned: 0,
            learn_failed: 0,
            last_dropped_set_id: f.stats().unwrap().last_dropped_set_id,
        }
    );
}

fn tpl(tid: u16) -> HftTemplate {
    HftTemplate {
        template_id: tid,
        fields: vec![HftField {
            label: 1,
            object_type: 1,
            stat_id: 4,
        }],
        width: 8,
    }
}

fn data(tid: u16) -> Vec<u8> {
    let mut out = Vec::new();
    Encoder::new(7, SeqMode::PerMessage).data_message(
        &mut out,
        0,
        &tpl(tid),
        [(1u64, &[7u64][..]), (2, &[8][..])],
    );
    out
}

/// One IPFIX message holding the given sets (id, body length).
fn message(sets: &[(u16, usize)]) -> Vec<u8> {
    let mut m = vec![0, 10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 7];
    for &(id, body) in sets {
        m.extend_from_slice(&id.to_be_bytes());
        m.extend_from_slice(&((body + 4) as u16).to_be_bytes());
        m.extend(std::iter::repeat_n(0x5A, body));
    }
    let l = m.len() as u16;
    m[2..4].copy_from_slice(&l.to_be_bytes());
    m
}

/// Datagrams covering every verdict, each with a distinct netlink sequence number where it has a
/// header. The first element says whether it is one netlink message (the user-space fallback sees
/// exactly its payload).
fn corpus() -> Vec<(bool, Vec<u8>)> {
    let mut c: Vec<(bool, Vec<u8>)> = Vec::new();
    let mut seq = 100;
    let mut one = |p: &[u8], c: &mut Vec<(bool, Vec<u8>)>| {
        seq += 1;
        c.push((true, framed(seq, p)));
    };
    let mut template = Vec::new();
    Encoder::new(7, SeqMode::PerMessage).template_message(&mut template, 0, &[tpl(256)]);
    for p in [
        data(256),                                                         // registered
        data(257),                                                         // not registered
        data(4000),                                                        // registered
        template.clone(),                                                  // template set
        message(&[(3, 12)]),                                               // options template set
        message(&[(500, 8), (600, 8), (700, 8)]),                          // none registered
        message(&[(500, 8), (600, 8), (4000, 8)]), // the last one registered
        message(&[(500, 8), (2, 12)]),             // a template after data
        message(&[(100, 4)]),                      // reserved set ID
        message(&(0..14).map(|i| (800 + i, 0)).collect::<Vec<_>>()), // fully walked: dropped
        message(&(0..15).map(|i| (800 + i, 0)).collect::<Vec<_>>()), // past the bound: kept
        data(256)[..30].to_vec(),                  // IPFIX length past the payload
        vec![0, 9, 0, 40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 4], // NetFlow v9
        vec![0, 10, 0, 16],                        // too short
        vec![],                                    // empty payload: too short
    ] {
        one(&p, &mut c);
    }
    let mut two = data(257);
    two.extend_from_slice(&data(256));
    one(&two, &mut c); // two IPFIX messages, the second registered
    let mut two = data(257);
    two.extend_from_slice(&data(258));
    one(&two, &mut c); // two IPFIX messages, none registered
                       // A control message type (NLMSG_NOOP) around unregistered data.
    let mut d = Vec::new();
    netlink::frame(&mut d, 1, 150, &data(257));
    c.push((true, d));
    // Shorter than an nlmsghdr.
    c.push((false, vec![1, 2, 3, 4, 5, 6, 7, 8]));
    // Several netlink messages in one datagram.
    let mut d = framed(160, &data(257));
    netlink::frame(&mut d, USERSOCK_MSG_TYPE, 161, &data(256));
    c.push((false, d));
    let mut d = framed(170, &data(257));
    netlink::frame(&mut d, USERSOCK_MSG_TYPE, 171, &data(258));
    c.push((false, d));
    c
}

#[test]
fn user_space_fallback_agrees_with_the_kernel_filter() {
    let group = 22;
    let rx = rx_socket(group, 64 << 20);
    let tx = tx_socket();
    let mut k = kernel_filter();
    k.attach(rx.as_fd()).unwrap();
    let mut u = TemplateFilter::user_space();
    let mut reg = TemplateSet::new();
    for t in [256, 4000] {
        k.register(t).unwrap();
        u.register(t).unwrap();
        reg.insert(t);
    }
    let corpus = corpus();
    for (_, d) in &corpus {
        tx.send_multicast(group, d).unwrap();
    }
    let got = drain(&rx);
    // What the kernel kept is exactly what the shared rule says, in order...
    let expected: Vec<Vec<u8>> = corpus
        .iter()
        .filter(|(_, d)| datagram_verdict(d, &reg).keep())
        .map(|(_, d)| d.clone())
        .collect();
    assert_eq!(got, expected);
    // ... and the corpus exercises both outcomes and every reason.
    let verdicts: Vec<Verdict> = corpus
        .iter()
        .map(|(_, d)| datagram_verdict(d, &reg))
        .collect();
    for v in [
        Verdict::TooShort,
        Verdict::NotIpfix,
        Verdict::Template,
        Verdict::Registered,
        Verdict::Malformed,
        Verdict::Unwalked,
        Verdict::Drop,
    ] {
        assert!(verdicts.contains(&v), "corpus lacks {v:?}");
    }
    // The user-space fallback, fed the payload of each one-message datagram, agrees.
    let mut kernel_single = FilterStats::default();
    for ((single, d), v) in corpus.iter().zip(&verdicts) {
        if !*single || d.len() < netlink::NLMSG_HDRLEN {
            continue;
        }
        let ty = u16::from_ne_bytes([d[4], d[5]]);
        if ty < netlink::NLMSG_MIN_TYPE {
            continue; // the reader skips control messages before the filter
        }
        let len = u32::from_ne_bytes(d[..4].try_into().unwrap()) as usize;
        let payload = &d[netlink::HEADERS_LEN..len];
        assert_eq!(
            u.keep(payload),
            v.keep(),
            "payload {payload:02x?}: kernel {v:?}"
        );
        kernel_single.count(*v);
    }
    // Counters agree (which set ID was dropped last is not a verdict count).
    let counts = |s: FilterStats| FilterStats {
        last_dropped_set_id: 0,
        ..s
    };
    assert_eq!(counts(u.stats().unwrap()), kernel_single);
    // The kernel counted every datagram.
    let mut all = FilterStats::default();
    verdicts.iter().for_each(|v| all.count(*v));
    assert_eq!(counts(k.stats().unwrap()), all);
    assert!(all.too_short >= 3 && all.dropped >= 4, "{all:?}");
}

#[test]
fn the_drop_path_costs_the_receiver_nothing() {
    let group = 23;
    // A small receive buffer that one data message overflows, and a receiver that never reads.
    let rcvbuf = 256 << 10;
    let filtered = rx_socket(group, rcvbuf);
    let unfiltered = rx_socket(group, rcvbuf); // the control: same group, no filter
    let tx = tx_socket();
    let mut f = kernel_filter();
    f.attach(filtered.as_fd()).unwrap();
    let mut emu = {
        let mut cfg = EmuConfig::design();
        cfg.ports = 64;
        cfg.template_id = 256;
        Emulator::new(cfg).unwrap()
    };
    let mut ipfix = Vec::new();
    let n = 300;
    for i in 0..n {
        ipfix.clear();
        emu.data_message(&mut ipfix);
        assert!(ipfix.len() > 60_000);
        tx.send_multicast(group, &framed(i, &ipfix)).unwrap();
    }
    // The filtered socket: every datagram dropped by the filter, nothing charged, nothing lost.
    assert_eq!(
        f.stats().unwrap(),
        FilterStats {
            seen: n as u64,
            kept: 0,
            dropped: n as u64,
            too_short: 0,
            learned: 0,
            learn_failed: 0,
            last_dropped_set_id: f.stats().unwrap().last_dropped_set_id,
        }
    );
    assert_eq!(filtered.drops().unwrap(), 0, "SO_MEMINFO drops");
    assert_eq!(proc_rmem_drops(&filtered), (0, 0), "(Rmem, Drops)");
    // The control socket filled up and lost datagrams: the same traffic does cost without the
    // filter (so the assertions above can fail).
    let (rmem, drops) = proc_rmem_drops(&unfiltered);
    assert!(rmem > 0, "the unfiltered socket holds data");
    assert!(drops > 0 && unfiltered.drops().unwrap() == drops);
    // Once the template is registered, the filtered socket is charged like any other.
    f.register(256).unwrap();
    ipfix.clear();
    emu.data_message(&mut ipfix);
    tx.send_multicast(group, &framed(n, &ipfix)).unwrap();
    assert!(proc_rmem_drops(&filtered).0 > 0);
    assert_eq!(drain(&filtered).len(), 1);
}

#[test]
fn too_short_and_non_ipfix_are_kept_and_counted() {
    let group = 24;
    let rx = rx_socket(group, 64 << 20);
    let tx = tx_socket();
    let mut f = kernel_filter();
    f.attach(rx.as_fd()).unwrap();
    let sent = [
        framed(1, &[0, 10, 0, 4]), // too short
        framed(2, &[]),            // too short
        vec![0; 12],               // shorter than an nlmsghdr
        framed(3, &{
            let mut v9 = data(999);
            v9[1] = 9;
            v9
        }), // not IPFIX
        framed(4, &data(999)),     // unregistered: dropped
    ];
    for d in &sent {
        tx.send_multicast(group, d).unwrap();
    }
    assert_eq!(drain(&rx), sent[..4].to_vec());
    assert_eq!(
        f.stats().unwrap(),
        FilterStats {
            seen: 5,
            kept: 4,
            dropped: 1,
            too_short: 3,
            learned: 0,
            learn_failed: 0,
            last_dropped_set_id: f.stats().unwrap().last_dropped_set_id,
        }
    );
}

#[test]
fn user_space_fallback_filters_the_same_without_the_kernel_program() {
    // Runs with or without the eBPF object: the fallback the daemon uses when it is missing.
    let mut f = TemplateFilter::user_space();
    assert!(!f.is_kernel() && f.fallback_reason().is_some());
    f.attach(tx_socket().as_fd()).unwrap(); // a no-op
    let mut emu = emulator(256);
    let (mut t, mut d) = (Vec::new(), Vec::new());
    emu.template_message(&mut t);
    emu.data_message(&mut d);
    assert!(f.keep(&t) && !f.keep(&d));
    f.register(256).unwrap();
    assert!(f.keep(&d));
    f.unregister(256).unwrap();
    assert!(!f.keep(&d) && f.keep(&d[..10]));
    assert_eq!(
        f.stats().unwrap(),
        FilterStats {
            seen: 5,
            kept: 3,
            dropped: 2,
            too_short: 1,
            learned: 0,
            learn_failed: 0,
            last_dropped_set_id: f.stats().unwrap().last_dropped_set_id,
        }
    );
}

/// Pins the calling thread to `cpu`.
fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; sched_setaffinity reads it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The kernel filter's per-CPU counters stay exact with many senders at once, several on the
/// same CPU (each run of the program counts with atomic adds, so a sender preempted or
/// interrupted mid-count on its CPU never loses another's update): every datagram sent is
/// `seen` once and `kept` or `dropped` exactly as its template says.
#[test]
fn counters_are_exact_with_concurrent_senders() {
    let group = 27;
    // Nobody reads: the filter runs before receive-buffer accounting, so what the full buffer
    // refuses was still seen (and counted) by the filter.
    let rx = rx_socket(group, 1 << 20);
    let mut f = kernel_filter();
    f.attach(rx.as_fd()).expect("attach");
    f.register(256).unwrap();
    let (keep, drop) = (framed(1, &data(256)), framed(2, &data(257)));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let senders = 4 * cpus.max(2);
    let per_sender = 50_000u64;
    std::thread::scope(|s| {
        for i in 0..senders {
            let (keep, drop) = (&keep, &drop);
            s.spawn(move || {
                pin_to(i % cpus);
                let tx = tx_socket();
                for n in 0..per_sender {
                    let d = if n % 2 == 0 { keep } else { drop };
                    tx.send_multicast(group, d).expect("send");
                }
            });
        }
    });
    let sent = senders as u64 * per_sender;
    let st = f.stats().unwrap();
    assert_eq!(
        (st.seen, st.kept, st.dropped),
        (sent, sent / 2, sent / 2),
        "{senders} senders on {cpus} CPUs: {st:?}"
    );
}
