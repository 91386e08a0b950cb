//! Generic netlink control plane: finding the switch's `sonic_stel` family and its `ipfix`
//! multicast group, and following the family when the vendor module is reloaded.
//!
//! ```text
//!  /etc/sonic/constants.yml ──► GenlConfig {family, group}          (constants.rs)
//!                                     │
//!  nlctrl (family 0x10) ◄── CTRL_CMD_GETFAMILY ── resolve()          (source.rs)
//!        │  "notify" group (resolved by name)
//!        ▼
//!  FamilyWatcher ── CtrlEvent ──► GenlSource ── join/leave ──► data socket (NETLINK_GENERIC)
//!                                     └── Change::{Joined, Lost, Rejoined} ──► daemon
//! ```
//!
//! This file is the pure part (no I/O, fuzzed by `fuzz/fuzz_targets/genl.rs`): building a
//! CTRL_CMD_GETFAMILY request, splitting datagrams into netlink messages, and parsing nlctrl
//! messages with every length checked. A GETFAMILY reply and a NEWFAMILY/DELFAMILY notification
//! are the same bytes (the kernel fills both with `ctrl_fill_info`), so one parser serves both.
//!
//! # Minimum kernel version
//! Generic netlink and CTRL_CMD_{NEW,DEL,GET}FAMILY, CTRL_ATTR_FAMILY_{ID,NAME}: 2.6.15.
//! Multicast groups (CTRL_ATTR_MCAST_GROUPS, CTRL_CMD_{NEW,DEL}MCAST_GRP, nlctrl's `notify`
//! group): 2.6.23. Current kernels allocate family IDs cyclically, so a reloaded family usually
//! comes back with a new ID; older ones may hand the same ID back, which [`GenlSource`] also
//! handles (it checks the data socket's membership, NETLINK_LIST_MEMBERSHIPS, 4.2).

mod constants;
mod source;
#[cfg(test)]
mod tests;

pub use constants::{
    ConstantsError, GenlConfig, DEFAULT_CONSTANTS_PATH, DEFAULT_FAMILY, DEFAULT_GROUP,
};
pub use source::{
    resolve, Change, FamilyWatcher, GenlCounters, GenlSource, GenlSourceConfig, GenlStatus, Watched,
};

use crate::netlink::{GENL_HDRLEN, NLMSG_HDRLEN};

/// nlctrl's own family ID (GENL_ID_CTRL = NLMSG_MIN_TYPE), fixed since 2.6.15. Used only to
/// address GETFAMILY requests; every other ID, nlctrl's notify group included, is resolved.
pub const GENL_ID_CTRL: u16 = 0x10;
/// nlctrl's family name.
pub const NLCTRL_FAMILY: &str = "nlctrl";
/// nlctrl's notification group (2.6.23): NEW/DEL FAMILY and NEW/DEL MCAST_GRP events.
pub const NLCTRL_NOTIFY_GROUP: &str = "notify";
/// GENL_NAMSIZ: family and group names are at most 15 bytes plus the NUL.
pub const GENL_NAMSIZ: usize = 16;

/// nlmsg_type of an error or acknowledgement.
pub const NLMSG_ERROR: u16 = 2;
/// nlmsg_type ending a multipart dump.
pub const NLMSG_DONE: u16 = 3;
/// nlmsg_flags: this is a request.
pub const NLM_F_REQUEST: u16 = 1;

/// A family was registered (also the command of a GETFAMILY reply). 2.6.15.
pub const CTRL_CMD_NEWFAMILY: u8 = 1;
/// A family was unregistered. 2.6.15.
pub const CTRL_CMD_DELFAMILY: u8 = 2;
/// Look a family up (by CTRL_ATTR_FAMILY_NAME or _ID). 2.6.15.
pub const CTRL_CMD_GETFAMILY: u8 = 3;
/// A multicast group was registered. 2.6.23.
pub const CTRL_CMD_NEWMCAST_GRP: u8 = 7;
/// A multicast group was unregistered. 2.6.23.
pub const CTRL_CMD_DELMCAST_GRP: u8 = 8;

/// u16 family ID. 2.6.15.
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
/// NUL-terminated family name. 2.6.15.
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// Nested list of nested groups, each {CTRL_ATTR_MCAST_GRP_NAME, CTRL_ATTR_MCAST_GRP_ID}. 2.6.23.
pub const CTRL_ATTR_MCAST_GROUPS: u16 = 7;
/// NUL-terminated group name. 2.6.23.
pub const CTRL_ATTR_MCAST_GRP_NAME: u16 = 1;
/// u32 group ID (what NETLINK_ADD_MEMBERSHIP takes). 2.6.23.
pub const CTRL_ATTR_MCAST_GRP_ID: u16 = 2;

/// NLA_TYPE_MASK: the attribute type without NLA_F_NESTED / NLA_F_NET_BYTEORDER.
const NLA_TYPE_MASK: u16 = !(1 << 15 | 1 << 14);
const NLA_HDRLEN: usize = 4;

/// A generic netlink family as nlctrl describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyInfo {
    /// The family ID: the nlmsg_type of its messages.
    pub id: u16,
    pub name: String,
    /// Multicast groups: (name, ID for NETLINK_ADD_MEMBERSHIP).
    pub groups: Vec<(String, u32)>,
}

impl FamilyInfo {
    /// The ID of the multicast group called `name`.
    pub fn group_id(&self, name: &str) -> Option<u32> {
        self.groups
            .iter()
            .find(|(n, _)| n == name)
            .map(|&(_, id)| id)
    }
}

/// An nlctrl notification (or, for `NewFamily`, a GETFAMILY reply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CtrlEvent {
    /// CTRL_CMD_NEWFAMILY: registered (or looked up), with its groups.
    NewFamily(FamilyInfo),
    /// CTRL_CMD_DELFAMILY: unregistered; the kernel has already removed every socket from the
    /// family's multicast groups.
    DelFamily { name: String, id: u16 },
    /// CTRL_CMD_NEWMCAST_GRP: a group of the family was registered.
    NewGroup {
        family: String,
        family_id: u16,
        group: String,
        group_id: u32,
    },
    /// CTRL_CMD_DELMCAST_GRP: a group of the family was unregistered.
    DelGroup {
        family: String,
        family_id: u16,
        group: String,
        group_id: u32,
    },
}

impl CtrlEvent {
    /// The family the event is about.
    pub fn family_name(&self) -> &str {
        match self {
            Self::NewFamily(f) => &f.name,
            Self::DelFamily { name, .. } => name,
            Self::NewGroup { family, .. } | Self::DelGroup { family, .. } => family,
        }
    }
}

/// One netlink message of a datagram, as far as the control plane cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// An nlctrl message we understand.
    Ctrl { seq: u32, event: CtrlEvent },
    /// NLMSG_ERROR: `errno` is positive (ENOENT = 2: no such family); 0 is an acknowledgement.
    Error { seq: u32, errno: i32 },
    /// NLMSG_DONE.
    Done { seq: u32 },
    /// Anything else: other nlctrl commands, other families, NOOP.
    Other { ty: u16, seq: u32 },
}

/// Malformed netlink or nlctrl bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("netlink message length {len} with {left} bytes left in the datagram")]
    MessageLength { len: u32, left: usize },
    #[error("{what} needs {need} bytes, has {have}")]
    Short {
        what: &'static str,
        need: usize,
        have: usize,
    },
    #[error("attribute length {len} with {left} bytes left")]
    AttrLength { len: u16, left: usize },
    #[error("nlctrl message without {0}")]
    Missing(&'static str),
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
}

/// Why a name cannot go into a GETFAMILY request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not a generic netlink name: {reason}")]
pub struct NameError {
    pub name: String,
    pub reason: &'static str,
}

/// Checks a family or group name against what the kernel accepts: 1..=15 bytes, no NUL.
///
/// # Errors
/// The name is empty, longer than GENL_NAMSIZ − 1, or contains NUL.
pub fn check_name(name: &str) -> Result<(), NameError> {
    let reason = if name.is_empty() {
        "empty"
    } else if name.len() >= GENL_NAMSIZ {
        "longer than 15 bytes (GENL_NAMSIZ)"
    } else if name.contains('\0') {
        "contains NUL"
    } else {
        return Ok(());
    };
    Err(NameError {
        name: name.to_owned(),
        reason,
    })
}

/// Builds a CTRL_CMD_GETFAMILY request for `name` with sequence number `seq`: nlmsghdr (type
/// GENL_ID_CTRL, NLM_F_REQUEST) + genlmsghdr + CTRL_ATTR_FAMILY_NAME.
///
/// # Errors
/// [`check_name`] failing.
pub fn getfamily_request(name: &str, seq: u32) -> Result<Vec<u8>, NameError> {
    check_name(name)?;
    let attr_len = NLA_HDRLEN + name.len() + 1;
    let len = NLMSG_HDRLEN + GENL_HDRLEN + align4(attr_len);
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(len as u32).to_ne_bytes());
    out.extend_from_slice(&GENL_ID_CTRL.to_ne_bytes());
    out.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    out.extend_from_slice(&seq.to_ne_bytes());
    out.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel fills in ours
    out.extend_from_slice(&[CTRL_CMD_GETFAMILY, 1, 0, 0]); // cmd, version, reserved
    out.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    out.extend_from_slice(&CTRL_ATTR_FAMILY_NAME.to_ne_bytes());
    out.extend_from_slice(name.as_bytes());
    out.resize(len, 0); // NUL terminator and padding
    Ok(out)
}

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// A netlink message header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NlHeader {
    pub len: u32,
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub pid: u32,
}

/// Splits a datagram into (header, bytes after the header) per netlink message. Yields one
/// error and stops at a length that is < 16 or runs past the datagram; never loops on length 0.
pub fn messages(datagram: &[u8]) -> Messages<'_> {
    Messages { rest: datagram }
}

/// Iterator returned by [`messages`].
#[derive(Debug, Clone)]
pub struct Messages<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Messages<'a> {
    type Item = Result<(NlHeader, &'a [u8]), ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.rest;
        if b.is_empty() {
            return None;
        }
        if b.len() < NLMSG_HDRLEN {
            self.rest = &[];
            return Some(Err(ParseError::Short {
                what: "nlmsghdr",
                need: NLMSG_HDRLEN,
                have: b.len(),
            }));
        }
        let h = NlHeader {
            len: u32::from_ne_bytes([b[0], b[1], b[2], b[3]]),
            ty: u16::from_ne_bytes([b[4], b[5]]),
            flags: u16::from_ne_bytes([b[6], b[7]]),
            seq: u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
            pid: u32::from_ne_bytes([b[12], b[13], b[14], b[15]]),
        };
        let len = h.len as usize;
        if len < NLMSG_HDRLEN || len > b.len() {
            self.rest = &[];
            return Some(Err(ParseError::MessageLength {
                len: h.len,
                left: b.len(),
            }));
        }
        self.rest = &b[align4(len).min(b.len())..];
        Some(Ok((h, &b[NLMSG_HDRLEN..len])))
    }
}

/// Parses every message of a datagram (see [`messages`] for how framing errors stop it).
pub fn parse_datagram(datagram: &[u8]) -> impl Iterator<Item = Result<Message, ParseError>> + '_ {
    messages(datagram).map(|m| m.and_then(|(h, body)| parse_message(&h, body)))
}

/// Parses one netlink message: `body` is what follows the nlmsghdr.
///
/// # Errors
/// A short NLMSG_ERROR or a malformed nlctrl message.
pub fn parse_message(h: &NlHeader, body: &[u8]) -> Result<Message, ParseError> {
    match h.ty {
        NLMSG_ERROR => {
            let e = body.get(..4).ok_or(ParseError::Short {
                what: "NLMSG_ERROR",
                need: 4,
                have: body.len(),
            })?;
            let error = i32::from_ne_bytes([e[0], e[1], e[2], e[3]]);
            Ok(Message::Error {
                seq: h.seq,
                errno: error.wrapping_neg(),
            })
        }
        NLMSG_DONE => Ok(Message::Done { seq: h.seq }),
        GENL_ID_CTRL => Ok(match parse_ctrl(body)? {
            Some(event) => Message::Ctrl { seq: h.seq, event },
            None => Message::Other {
                ty: h.ty,
                seq: h.seq,
            },
        }),
        ty => Ok(Message::Other { ty, seq: h.seq }),
    }
}

/// Parses an nlctrl message body (genlmsghdr + attributes). `Ok(None)` for commands the
/// control plane does not use (NEWOPS, GETPOLICY replies, ...).
///
/// # Errors
/// A short genlmsghdr, an attribute whose length is < 4 or runs past its container, a missing
/// family ID/name or group ID/name, a name that is not UTF-8.
pub fn parse_ctrl(body: &[u8]) -> Result<Option<CtrlEvent>, ParseError> {
    if body.len() < GENL_HDRLEN {
        return Err(ParseError::Short {
            what: "genlmsghdr",
            need: GENL_HDRLEN,
            have: body.len(),
        });
    }
    let cmd = body[0];
    if !matches!(
        cmd,
        CTRL_CMD_NEWFAMILY | CTRL_CMD_DELFAMILY | CTRL_CMD_NEWMCAST_GRP | CTRL_CMD_DELMCAST_GRP
    ) {
        return Ok(None);
    }
    let mut id = None;
    let mut name = None;
    let mut groups = Vec::new();
    for a in attrs(&body[GENL_HDRLEN..]) {
        let (ty, p) = a?;
        match ty {
            CTRL_ATTR_FAMILY_ID => id = Some(u16_attr(p, "CTRL_ATTR_FAMILY_ID")?),
            CTRL_ATTR_FAMILY_NAME => name = Some(str_attr(p, "CTRL_ATTR_FAMILY_NAME")?),
            CTRL_ATTR_MCAST_GROUPS => {
                for g in attrs(p) {
                    let (_index, gp) = g?;
                    groups.push(parse_group(gp)?);
                }
            }
            _ => {}
        }
    }
    let id = id.ok_or(ParseError::Missing("CTRL_ATTR_FAMILY_ID"))?;
    let name = name.ok_or(ParseError::Missing("CTRL_ATTR_FAMILY_NAME"))?;
    Ok(Some(match cmd {
        CTRL_CMD_NEWFAMILY => CtrlEvent::NewFamily(FamilyInfo { id, name, groups }),
        CTRL_CMD_DELFAMILY => CtrlEvent::DelFamily { name, id },
        _ => {
            // ctrl_fill_mcgrp_info puts exactly one group in the list.
            let (group, group_id) = groups
                .into_iter()
                .next()
                .ok_or(ParseError::Missing("CTRL_ATTR_MCAST_GROUPS entry"))?;
            if cmd == CTRL_CMD_NEWMCAST_GRP {
                CtrlEvent::NewGroup {
                    family: name,
                    family_id: id,
                    group,
                    group_id,
                }
            } else {
                CtrlEvent::DelGroup {
                    family: name,
                    family_id: id,
                    group,
                    group_id,
                }
            }
        }
    }))
}

fn parse_group(p: &[u8]) -> Result<(String, u32), ParseError> {
    let mut name = None;
    let mut id = None;
    for a in attrs(p) {
        let (ty, v) = a?;
        match ty {
            CTRL_ATTR_MCAST_GRP_NAME => name = Some(str_attr(v, "CTRL_ATTR_MCAST_GRP_NAME")?),
            CTRL_ATTR_MCAST_GRP_ID => id = Some(u32_attr(v, "CTRL_ATTR_MCAST_GRP_ID")?),
            _ => {}
        }
    }
    Ok((
        name.ok_or(ParseError::Missing("CTRL_ATTR_MCAST_GRP_NAME"))?,
        id.ok_or(ParseError::Missing("CTRL_ATTR_MCAST_GRP_ID"))?,
    ))
}

/// Iterates netlink attributes (type with flags masked off, payload). Yields one error and
/// stops at a length < 4 or past the end; every step advances by ≥ 4 bytes.
fn attrs(buf: &[u8]) -> Attrs<'_> {
    Attrs { rest: buf }
}

struct Attrs<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Result<(u16, &'a [u8]), ParseError>;

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.rest;
        if b.is_empty() {
            return None;
        }
        self.rest = &[];
        if b.len() < NLA_HDRLEN {
            return Some(Err(ParseError::Short {
                what: "nlattr",
                need: NLA_HDRLEN,
                have: b.len(),
            }));
        }
        let len = u16::from_ne_bytes([b[0], b[1]]);
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        let l = len as usize;
        if l < NLA_HDRLEN || l > b.len() {
            return Some(Err(ParseError::AttrLength { len, left: b.len() }));
        }
        self.rest = &b[align4(l).min(b.len())..];
        Some(Ok((ty, &b[NLA_HDRLEN..l])))
    }
}

fn u16_attr(p: &[u8], what: &'static str) -> Result<u16, ParseError> {
    match p {
        [a, b, ..] => Ok(u16::from_ne_bytes([*a, *b])),
        _ => Err(ParseError::Short {
            what,
            need: 2,
            have: p.len(),
        }),
    }
}

fn u32_attr(p: &[u8], what: &'static str) -> Result<u32, ParseError> {
    match p {
        [a, b, c, d, ..] => Ok(u32::from_ne_bytes([*a, *b, *c, *d])),
        _ => Err(ParseError::Short {
            what,
            need: 4,
            have: p.len(),
        }),
    }
}

/// A NUL-terminated string attribute (the bytes before the first NUL; all of them if none).
fn str_attr(p: &[u8], what: &'static str) -> Result<String, ParseError> {
    let end = p.iter().position(|&c| c == 0).unwrap_or(p.len());
    std::str::from_utf8(&p[..end])
        .map(str::to_owned)
        .map_err(|_| ParseError::NotUtf8(what))
}
