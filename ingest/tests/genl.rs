//! Generic netlink control plane against the real kernel: nlctrl (a genl family every kernel
//! has, ID 0x10, group `notify`) resolved and parsed from the kernel's own bytes; the watcher's
//! subscription; the data-socket state machine joining and repairing real memberships.
//!
//! What cannot be done here: make the kernel register or unregister a family on demand. This
//! kernel has no module support (no /proc/modules, no /lib/modules), so there is no vendor module
//! to load/unload, and every built-in family registers at boot. The notification path is fed
//! instead with the kernel's GETFAMILY reply, which the kernel builds with the same function as
//! a NEWFAMILY/DELFAMILY notification (`ctrl_fill_info`, cmd NEWFAMILY in the reply), with the
//! cmd byte, seq and port set as a notification carries them.
//!
//! Needs root only for symmetry with the other kernel tests (genl groups are joinable
//! unprivileged); fails loudly, never skips.
use std::time::Duration;

use stel_ingest::{
    genl::{
        self, Change, CtrlEvent, FamilyWatcher, GenlConfig, GenlSource, GenlSourceConfig,
        GenlStatus, Message, CTRL_CMD_DELFAMILY, CTRL_CMD_NEWFAMILY, CTRL_CMD_NEWMCAST_GRP,
        GENL_ID_CTRL,
    },
    sys::netlink::NetlinkSocket,
};

/// nlctrl's notify group: its mcgrp_offset is GENL_ID_CTRL on every kernel (`genl ctrl list`
/// here: "#1: ID-0x10 name: notify").
const NOTIFY: u32 = 0x10;

fn generic() -> NetlinkSocket {
    NetlinkSocket::generic().expect("NETLINK_GENERIC socket")
}

/// One GETFAMILY round trip done by hand: the kernel's reply bytes, untouched.
fn raw_getfamily(name: &str, seq: u32) -> Vec<u8> {
    let s = generic();
    s.send_to_kernel(&genl::getfamily_request(name, seq).unwrap())
        .expect("sendto nlctrl");
    assert!(s.wait_readable(Duration::from_secs(2)).unwrap(), "no reply");
    let mut buf = vec![0u8; 64 << 10];
    let (n, real) = s.try_recv(&mut buf).unwrap().expect("reply queued");
    assert_eq!(n, real, "reply truncated");
    buf.truncate(n);
    buf
}

fn nlctrl_info(groups_must_have_notify: bool) -> genl::FamilyInfo {
    let info = genl::resolve(&generic(), "nlctrl")
        .expect("resolve nlctrl")
        .expect("nlctrl exists");
    if groups_must_have_notify {
        assert_eq!(info.group_id("notify"), Some(NOTIFY));
    }
    info
}

#[test]
fn resolves_nlctrl_from_real_kernel_bytes() {
    let info = nlctrl_info(true);
    assert_eq!(info.id, GENL_ID_CTRL);
    assert_eq!(info.name, "nlctrl");

    let bytes = raw_getfamily("nlctrl", 4242);
    // The reply: one message, type nlctrl, our seq, cmd NEWFAMILY.
    let msgs: Vec<_> = genl::messages(&bytes).collect();
    assert_eq!(msgs.len(), 1);
    let (h, body) = msgs[0].clone().unwrap();
    assert_eq!((h.ty, h.seq), (GENL_ID_CTRL, 4242));
    assert_eq!(
        body[0], CTRL_CMD_NEWFAMILY,
        "the kernel answers GETFAMILY with NEWFAMILY"
    );
    let parsed: Vec<_> = genl::parse_datagram(&bytes).collect();
    assert_eq!(
        parsed,
        vec![Ok(Message::Ctrl {
            seq: 4242,
            event: CtrlEvent::NewFamily(info.clone())
        })]
    );
}

#[test]
fn real_reply_bytes_through_the_notification_parser() {
    let info = nlctrl_info(true);
    let mut bytes = raw_getfamily("nlctrl", 7);
    // As a notification: seq 0, port 0 (genl_ctrl_event multicasts with portid 0, seq 0).
    bytes[8..16].fill(0);
    let mut w = FamilyWatcher::new("nlctrl").expect("watcher");
    let notify_msgs: Vec<_> = genl::parse_datagram(&bytes).collect();
    assert_eq!(
        notify_msgs,
        vec![Ok(Message::Ctrl {
            seq: 0,
            event: CtrlEvent::NewFamily(info.clone())
        })]
    );
    // DELFAMILY: same ctrl_fill_info bytes, cmd 2.
    bytes[16] = CTRL_CMD_DELFAMILY;
    assert_eq!(
        genl::parse_datagram(&bytes).collect::<Vec<_>>(),
        vec![Ok(Message::Ctrl {
            seq: 0,
            event: CtrlEvent::DelFamily {
                name: "nlctrl".into(),
                id: GENL_ID_CTRL
            }
        })]
    );
    // NEWMCAST_GRP: name, id and a one-group list are a subset of ctrl_fill_info's attributes.
    bytes[16] = CTRL_CMD_NEWMCAST_GRP;
    assert_eq!(
        genl::parse_datagram(&bytes).collect::<Vec<_>>(),
        vec![Ok(Message::Ctrl {
            seq: 0,
            event: CtrlEvent::NewGroup {
                family: "nlctrl".into(),
                family_id: GENL_ID_CTRL,
                group: "notify".into(),
                group_id: NOTIFY
            }
        })]
    );
    // Nothing is registering families here: the watcher sees no event.
    assert_eq!(
        w.poll(Duration::from_millis(50)).unwrap(),
        genl::Watched::default()
    );
}

#[test]
fn absent_family_is_none_and_the_name_limit_is_the_kernels() {
    let s = generic();
    assert_eq!(genl::resolve(&s, "stel_no_such").unwrap(), None);
    // 15 bytes is accepted by the kernel (ENOENT, not EINVAL) ...
    assert_eq!(genl::resolve(&s, "stel_fifteen_bb").unwrap(), None);
    // ... 16 is refused by us, and by the kernel when sent anyway (CTRL_ATTR_FAMILY_NAME policy
    // is NLA_NUL_STRING of GENL_NAMSIZ - 1).
    let e = genl::resolve(&s, "stel_sixteen_bbb").unwrap_err();
    assert_eq!(e.source.kind(), std::io::ErrorKind::InvalidInput);
    let mut req = genl::getfamily_request("stel_fifteen_bb", 99).unwrap();
    let name_at = 24;
    req.truncate(name_at);
    req.extend_from_slice(b"stel_sixteen_bbb\0\0\0\0");
    let attr_len = (4 + 17u16).to_ne_bytes();
    req[20..22].copy_from_slice(&attr_len);
    let len = (req.len() as u32).to_ne_bytes();
    req[0..4].copy_from_slice(&len);
    s.send_to_kernel(&req).unwrap();
    assert!(s.wait_readable(Duration::from_secs(2)).unwrap());
    let mut buf = vec![0u8; 4096];
    let (n, _) = s.try_recv(&mut buf).unwrap().unwrap();
    let got: Vec<_> = genl::parse_datagram(&buf[..n]).collect();
    assert_eq!(
        got,
        vec![Ok(Message::Error {
            seq: 99,
            errno: libc::EINVAL
        })]
    );
}

#[test]
fn memberships_follow_join_and_leave() {
    let s = generic();
    assert_eq!(s.memberships().unwrap(), Vec::<u32>::new());
    s.join_group(NOTIFY).unwrap();
    assert_eq!(s.memberships().unwrap(), vec![NOTIFY]);
    s.leave_group(NOTIFY).unwrap();
    assert_eq!(s.memberships().unwrap(), Vec::<u32>::new());
    // Leaving again (what happens after the kernel cleared us) is not an error.
    s.leave_group(NOTIFY).unwrap();
}

#[test]
fn watcher_joins_nlctrl_notify_by_name() {
    let w = FamilyWatcher::new("sonic_stel").expect("watcher");
    assert_eq!(w.notify_group(), NOTIFY);
    assert_eq!(w.notify_socket().memberships().unwrap(), vec![NOTIFY]);
    assert_eq!(w.family(), "sonic_stel");
    assert_eq!(w.resolve().unwrap(), None, "no switch here");
    assert_eq!(w.resolve_family("nlctrl").unwrap(), Some(nlctrl_info(true)));
}

fn source(family: &str, group: &str, resync: Duration) -> GenlSource {
    GenlSource::new(GenlSourceConfig {
        genl: GenlConfig {
            family: family.into(),
            group: group.into(),
        },
        resync_interval: resync,
    })
    .expect("GenlSource")
}

#[test]
fn absent_family_waits_without_blocking() {
    let data = generic();
    let mut src = source("stel_absent", "ipfix", Duration::from_secs(3600));
    let t = std::time::Instant::now();
    assert_eq!(src.poll(&data, Duration::ZERO).unwrap(), None);
    assert!(t.elapsed() < Duration::from_secs(1));
    assert_eq!(src.status().to_string(), "waiting for family stel_absent");
    assert!(!src.is_joined());
    assert_eq!(data.memberships().unwrap(), Vec::<u32>::new());
    assert_eq!(src.counters().resyncs, 1);
}

#[test]
fn missing_group_is_reported_not_joined() {
    let data = generic();
    let mut src = source("nlctrl", "ipfix", Duration::from_secs(3600));
    assert_eq!(src.poll(&data, Duration::ZERO).unwrap(), None);
    assert_eq!(
        src.status(),
        GenlStatus::NoGroup {
            family: "nlctrl".into(),
            family_id: GENL_ID_CTRL,
            group: "ipfix".into()
        }
    );
    assert_eq!(data.memberships().unwrap(), Vec::<u32>::new());
}

/// nlctrl/notify stands in for sonic_stel/ipfix: a real family and group.
#[test]
fn source_joins_and_the_backstop_repairs_a_lost_membership() {
    let data = generic();
    let mut src = source("nlctrl", "notify", Duration::from_millis(100));
    assert_eq!(
        src.poll(&data, Duration::ZERO).unwrap(),
        Some(Change::Joined {
            family_id: GENL_ID_CTRL,
            group_id: NOTIFY
        })
    );
    assert_eq!(data.memberships().unwrap(), vec![NOTIFY]);
    assert_eq!(
        src.status().to_string(),
        "joined nlctrl/notify (family id 0x10, group 16)"
    );
    assert_eq!(src.poll(&data, Duration::ZERO).unwrap(), None);
    // What the kernel does to every member when a family unregisters
    // (__netlink_clear_multicast_users); a re-registration with the same IDs and a missed
    // notification leaves exactly this state.
    data.leave_group(NOTIFY).unwrap();
    std::thread::sleep(Duration::from_millis(150));
    assert_eq!(
        src.poll(&data, Duration::ZERO).unwrap(),
        Some(Change::Rejoined {
            family_id: GENL_ID_CTRL,
            group_id: NOTIFY
        })
    );
    assert_eq!(data.memberships().unwrap(), vec![NOTIFY]);
    let c = src.counters();
    assert_eq!((c.joins, c.rejoins, c.losses), (1, 1, 0));
    assert_eq!(c.resync_repairs, 1);
    // poll(timeout) returns at the resync deadline, not later.
    let t = std::time::Instant::now();
    assert_eq!(src.poll(&data, Duration::from_secs(5)).unwrap(), None);
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
}

/// Real notification bytes (see the module doc) drive the state machine, which joins and
/// leaves the real group on the real data socket.
#[test]
fn notifications_from_real_bytes_drive_leave_and_rejoin() {
    let data = generic();
    let mut src = source("nlctrl", "notify", Duration::from_secs(3600));
    assert!(matches!(
        src.poll(&data, Duration::ZERO).unwrap(),
        Some(Change::Joined { .. })
    ));
    let mut bytes = raw_getfamily("nlctrl", 1);
    bytes[8..16].fill(0);
    bytes[16] = CTRL_CMD_DELFAMILY;
    let del = match genl::parse_datagram(&bytes).next() {
        Some(Ok(Message::Ctrl { event, .. })) => event,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        src.apply_event(del.clone(), &data).unwrap(),
        Some(Change::Lost {
            family_id: GENL_ID_CTRL,
            group_id: NOTIFY
        })
    );
    assert_eq!(data.memberships().unwrap(), Vec::<u32>::new());
    assert_eq!(src.status().to_string(), "waiting for family nlctrl");
    assert_eq!(src.apply_event(del, &data).unwrap(), None, "idempotent");

    bytes[16] = CTRL_CMD_NEWFAMILY;
    let new = match genl::parse_datagram(&bytes).next() {
        Some(Ok(Message::Ctrl { event, .. })) => event,
        other => panic!("{other:?}"),
    };
    assert_eq!(
        src.apply_event(new.clone(), &data).unwrap(),
        Some(Change::Rejoined {
            family_id: GENL_ID_CTRL,
            group_id: NOTIFY
        })
    );
    assert_eq!(data.memberships().unwrap(), vec![NOTIFY]);
    // A second NEWFAMILY with the same IDs while still a member changes nothing.
    assert_eq!(src.apply_event(new, &data).unwrap(), None);
    // Events about other families are ignored.
    let other = CtrlEvent::DelFamily {
        name: "thermal".into(),
        id: 0x13,
    };
    assert_eq!(src.apply_event(other, &data).unwrap(), None);
    assert!(src.is_joined());
    let c = src.counters();
    assert_eq!((c.joins, c.losses, c.rejoins), (1, 1, 1));
}
