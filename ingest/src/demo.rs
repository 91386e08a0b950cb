//! The demo: the switch emulator ([`stel_emu`]) on a thread of the daemon, sending over a
//! local socket pair into the daemon's own reader (`stel-ingestd --demo`), and the line that
//! says whether it kept the asked rate and, if not, why.
use std::{
    os::fd::{AsFd, OwnedFd},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};
use stel_emu::{self as emu, EmuConfig, Emulator, GroundTruth, Pattern};

use crate::{netlink, sys};

/// What the demo flags ask of the emulator.
#[derive(Debug, Clone, Copy)]
pub struct DemoSettings {
    /// Ports to emulate.
    pub ports: usize,
    /// Stats per port.
    pub stats: usize,
    /// Poll interval, ns.
    pub interval_ns: u64,
    /// Load pattern.
    pub pattern: Pattern,
}

/// The demo's switch: the design rate, or what the demo flags ask for.
///
/// # Errors
/// Settings the emulator refuses.
pub fn emulator(a: &DemoSettings) -> Result<Emulator, String> {
    let mut cfg = EmuConfig::design();
    cfg.ports = a.ports;
    cfg.stats = emu::default_stats(cfg.group, a.stats);
    cfg.interval_ns = a.interval_ns;
    cfg.pattern = a.pattern;
    // Switch time starts now, so the demo's history is where `stel-query --since 10m` looks.
    cfg.start_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(cfg.start_ns, |d| d.as_nanos() as u64);
    Emulator::new(cfg).map_err(|e| format!("demo: {e}"))
}

/// What the demo's emulator thread did besides sending: for the "achieved vs asked" line.
#[derive(Debug, Clone, Copy, Default)]
pub struct DemoPace {
    /// Wall time the thread ran, s.
    pub wall_s: f64,
    /// Its own CPU time (generating, framing, copying into the socket), s.
    pub cpu_s: f64,
    /// Time spent in `send` (copying into the socket, or waiting for room when the daemon's
    /// socket is full), s.
    pub blocked_s: f64,
}

/// CPU seconds (user + system) of the calling thread, from `/proc/thread-self/stat` (the same
/// clock as the process total in `/proc/self/stat`, so the two subtract; stel-bench e2e uses it).
pub fn thread_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap_or_default();
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ut: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    let st: f64 = f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    (ut + st) / 100.0
}

/// The demo's emulator thread: frames messages like a switch and sends them over the local
/// socket pair (blocking when the daemon is behind: the demo never loses data). Returns what
/// it sent (the ground truth), the number of datagrams and its pace.
///
/// # Errors
/// The thread cannot be spawned.
pub fn spawn(
    mut producer: Emulator,
    tx: OwnedFd,
    halt: Arc<AtomicBool>,
) -> Result<JoinHandle<(GroundTruth, u64, DemoPace)>, String> {
    let _ = sys::set_sndbuf(tx.as_fd(), 8 << 20);
    std::thread::Builder::new()
        .name("stel-demo-emu".into())
        .spawn(move || {
            let period = Duration::from_nanos(
                producer.snapshots_per_message() as u64 * producer.cfg.interval_ns,
            );
            let (mut ipfix, mut frame) = (Vec::new(), Vec::new());
            let mut sent = 0u64;
            let start = Instant::now();
            let cpu0 = thread_cpu_s();
            let mut blocked = Duration::ZERO;
            let mut k = 0u32;
            producer.template_message(&mut ipfix);
            loop {
                frame.clear();
                netlink::frame(&mut frame, netlink::USERSOCK_MSG_TYPE, k, &ipfix);
                let t = Instant::now();
                if sys::send(tx.as_fd(), &frame).is_err() {
                    break;
                }
                blocked += t.elapsed();
                sent += 1;
                if halt.load(Ordering::Relaxed) {
                    break;
                }
                ipfix.clear();
                producer.data_message(&mut ipfix);
                k += 1;
                let due = start + period * k;
                // In short naps, so a stop is seen within 50 ms even at slow demo rates.
                while let Some(left) = due.checked_duration_since(Instant::now()) {
                    if halt.load(Ordering::Relaxed) {
                        break;
                    }
                    std::thread::sleep(left.min(Duration::from_millis(50)));
                }
            }
            let pace = DemoPace {
                wall_s: start.elapsed().as_secs_f64(),
                cpu_s: thread_cpu_s() - cpu0,
                blocked_s: blocked.as_secs_f64(),
            };
            (producer.truth, sent, pace)
        })
        .map_err(|e| e.to_string())
}

/// "asked X, achieved Y" and, when the emulator fell behind, why: its own CPU (generating the
/// counters took a whole core) or the daemon (sends blocked on a full socket).
pub fn pace_line(asked: f64, counters: u64, p: &DemoPace) -> String {
    let achieved = counters as f64 / p.wall_s.max(1e-9);
    let mut line = format!(
        "demo rate: asked {} counters/s, achieved {} counters/s ({:.0} %)",
        rate(asked),
        rate(achieved),
        achieved / asked * 100.0
    );
    if achieved < 0.95 * asked {
        let busy = p.cpu_s / p.wall_s.max(1e-9);
        let blocked = p.blocked_s / p.wall_s.max(1e-9);
        line.push_str(&format!(
            "; the emulator fell behind: its thread used {:.0} % of a core and spent {:.0} % of the time in send (copying into the socket or waiting for the daemon to make room) — ",
            busy * 100.0,
            blocked * 100.0
        ));
        line.push_str(if blocked >= 0.5 {
            "the daemon could not take the data as fast (see the status lines for where it was shed or queued)"
        } else if busy >= 0.8 {
            "it is CPU-bound: generating and framing the counters takes a whole core (on a switch the ASIC's DMA engine does this)"
        } else {
            "it did not get the CPU: the daemon's threads and other processes on this machine kept the cores busy (see the load average)"
        });
    }
    line
}

/// A rate with two significant digits at least, in M or k: `192 M`, `1.5 M`, `120 k`, `4.0 k`,
/// `12` (`{:.0} M` printed 0.12 M as `0 M`).
pub fn rate(v: f64) -> String {
    let (x, unit) = if v >= 1e6 {
        (v / 1e6, " M")
    } else if v >= 1e3 {
        (v / 1e3, " k")
    } else {
        (v, "")
    };
    if x >= 10.0 || unit.is_empty() {
        format!("{x:.0}{unit}")
    } else {
        format!("{x:.1}{unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_line_says_why_the_emulator_fell_behind() {
        let p = |cpu_s, blocked_s| DemoPace {
            wall_s: 10.0,
            cpu_s,
            blocked_s,
        };
        let ok = pace_line(100e6, 1_000_000_000, &p(5.0, 1.0));
        assert_eq!(
            ok,
            "demo rate: asked 100 M counters/s, achieved 100 M counters/s (100 %)"
        );
        // Below 1 M: k, never "0 M" (a 2 ports × 30 stats demo at 1 ms: 0.12 M).
        let small = pace_line(120e3, 1_200_000, &p(0.1, 0.0));
        assert_eq!(
            small,
            "demo rate: asked 120 k counters/s, achieved 120 k counters/s (100 %)"
        );
        assert_eq!(
            [
                rate(192e6),
                rate(1.46e6),
                rate(4_000.0),
                rate(12.4),
                rate(0.0)
            ],
            ["192 M", "1.5 M", "4.0 k", "12", "0"]
        );
        let daemon = pace_line(100e6, 500_000_000, &p(3.0, 6.0));
        assert!(daemon.contains("(50 %)") && daemon.contains("the daemon could not take"));
        let cpu = pace_line(100e6, 500_000_000, &p(9.0, 1.0));
        assert!(cpu.contains("it is CPU-bound"), "{cpu}");
        let starved = pace_line(100e6, 500_000_000, &p(2.0, 1.0));
        assert!(starved.contains("it did not get the CPU"), "{starved}");
    }
}
