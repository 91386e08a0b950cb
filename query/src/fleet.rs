//! Fleet lakes in this process: a root whose top level is `switch=<name>/` (what the daemons'
//! uploaders write, `store/LAKE.md`) is asked switch by switch, each switch's root being an
//! ordinary history; the window is resolved once, against the newest sample of the whole fleet,
//! so every switch answers for the same time. A root without `switch=` directories (one
//! daemon's data dir) is one target without a switch name, as before.
//!
//! The same questions sent to a distributed engine are in [`crate::spark`]; both print the same
//! rows for the same files.

use std::sync::Arc;

use arrow_schema::Schema;
use stel_store::{paths::unescape_value, sai::ObjectType};

use crate::{
    catalog::{Catalog, Column, Location, Session},
    error::{Error, Result},
    settings::{TimeArgs, TimeRange},
};

/// One switch's history (or the only one).
#[derive(Debug)]
pub struct Target {
    /// The switch name (`None` for a plain data dir).
    pub switch: Option<String>,
    pub cat: Catalog,
}

/// Opens `data`: one target per `switch=` directory (only `switches` when given), or the root
/// itself when it has none.
///
/// # Errors
/// An unusable location, no switch left after the filter, no data at all.
pub async fn open(data: &str, switches: &[String], strict: bool) -> Result<Vec<Target>> {
    let loc = Location::parse(data, false)?;
    let dirs = loc.subdirs_pub("", "switch").await?;
    if dirs.is_empty() {
        let tiers = loc
            .subdirs_pub(stel_store::paths::TIERS_DIR, "tier")
            .await?;
        if !tiers.is_empty() {
            let under = format!("{}/tier=<t>/switch=<s>/", stel_store::paths::TIERS_DIR);
            return Err(crate::catalog::tiers_only(data, &tiers, &under));
        }
        if !switches.is_empty() {
            return Err(Error::Usage(format!(
                "--switch: {data} is one switch's history, not a fleet lake (no switch=<name>/ directories)"
            )));
        }
        return Ok(vec![Target {
            switch: None,
            cat: Catalog::open(data, strict).await?,
        }]);
    }
    let names: Vec<String> = dirs
        .iter()
        .map(|d| unescape_value(d).unwrap_or_else(|| d.clone()))
        .collect();
    check_switches(data, switches, &names)?;
    let mut out = Vec::new();
    let base = data.trim_end_matches('/');
    for (d, name) in dirs.iter().zip(names) {
        if !switches.is_empty() && !switches.contains(&name) {
            continue;
        }
        match Catalog::open(&format!("{base}/switch={d}"), strict).await {
            Ok(mut cat) => {
                // The switch's rollup tiers sit in the lake's `_tiers/` tree.
                let mut found = Vec::new();
                for s in &cat.sessions {
                    let (p, g) = (
                        s.dir
                            .trim_start_matches("profile=")
                            .split('/')
                            .next()
                            .unwrap_or(""),
                        s.dir
                            .rsplit('/')
                            .next()
                            .unwrap_or("")
                            .trim_start_matches("group="),
                    );
                    found.push(crate::tiers::discover_lake(&cat, &loc, d, p, g, &s.table).await?);
                }
                for (s, t) in cat.sessions.iter_mut().zip(found) {
                    if s.tiers.is_empty() {
                        s.tiers = t;
                    }
                }
                out.push(Target {
                    switch: Some(name),
                    cat,
                })
            }
            // A switch directory without a published file yet.
            Err(Error::NotFound(_)) => continue,
            Err(e) => return Err(e),
        }
    }
    if out.is_empty() {
        return Err(Error::NotFound(format!(
            "no switch of {data} has data{} ({} switch directories)",
            if switches.is_empty() {
                String::new()
            } else {
                format!(" among {}", switches.join(", "))
            },
            dirs.len()
        )));
    }
    Ok(out)
}

/// How many of the lake's switch names an unknown `--switch` error lists.
const NAMES_LISTED: usize = 20;

/// Every name of `wanted` (`--switch`) must be a switch of the lake at `data`, which has
/// `have` (its `switch=<name>/` directories, escapes undone): a typo is an error naming what
/// the lake has, not an empty answer, on either engine.
///
/// # Errors
/// [`Error::Usage`] (exit 2) naming the unknown switches and the lake's (the first
/// [`NAMES_LISTED`]).
pub fn check_switches(data: &str, wanted: &[String], have: &[String]) -> Result<()> {
    let unknown: Vec<&str> = wanted
        .iter()
        .filter(|w| !have.contains(w))
        .map(String::as_str)
        .collect();
    if unknown.is_empty() {
        return Ok(());
    }
    let mut have: Vec<&str> = have.iter().map(String::as_str).collect();
    have.sort_by(|a, b| stel_store::sai::natural_cmp(a, b));
    have.dedup();
    let listed = if have.is_empty() {
        "it has no switch=<name>/ directories".to_string()
    } else if have.len() > NAMES_LISTED {
        format!(
            "it has {} switches: {}, …",
            have.len(),
            have[..NAMES_LISTED].join(", ")
        )
    } else {
        format!("it has {}", have.join(", "))
    };
    Err(Error::Usage(format!(
        "no switch{} {} in {}/ ({listed})",
        if unknown.len() > 1 { "es" } else { "" },
        unknown.join(", "),
        data.trim_end_matches('/'),
    )))
}

/// The targets that have a session for `profile`/`group`, and the window resolved against the
/// newest sample of all of them.
///
/// # Errors
/// No target has the session (the message lists what exists), bad time flags.
pub async fn sessions<'a>(
    targets: &'a [Target],
    profile: Option<&str>,
    group: &str,
    time: &TimeArgs,
) -> Result<(Vec<(&'a Target, &'a Session)>, TimeRange)> {
    let mut found = Vec::new();
    let mut first_err = None;
    for t in targets {
        match t.cat.session(profile, group) {
            Ok(s) => found.push((t, s)),
            // A switch without the session (or without the group at all) is left out while
            // another has it.
            Err(e)
                if targets.len() > 1
                    && (matches!(e, Error::NotFound(_)) || !t.cat.has_group(group)) =>
            {
                first_err.get_or_insert(e);
            }
            Err(e) => return Err(e),
        }
    }
    if found.is_empty() {
        return Err(first_err.unwrap_or_else(|| Error::NotFound(format!("no {group} session"))));
    }
    let mut extent: Option<(i64, i64)> = None;
    for (t, s) in &found {
        if let Some((a, b)) = t.cat.extent(s).await? {
            extent = Some(extent.map_or((a, b), |(x, y)| (x.min(a), y.max(b))));
        }
    }
    let r = time.resolve(extent)?;
    Ok((found, r))
}

/// Whether column `c` belongs to a session of `group` (by object naming and the group's SAI
/// stat table): the fleet view's schema is the union of every group's columns.
pub fn column_of_group(c: &Column, group: &str) -> bool {
    let Some(t) = ObjectType::from_name(group) else {
        return true;
    };
    let per_port = matches!(t, ObjectType::Queue | ObjectType::IngressPriorityGroup);
    per_port == c.object.contains('|') && t.stat_by_name(&c.stat).is_some()
}

/// A session standing for `group` across the lake (the engine's merged schema), for the
/// commands' column choices.
pub fn lake_session(columns: &[Column], group: &str, profile: Option<&str>) -> Session {
    Session {
        profile: profile.unwrap_or("*").to_string(),
        group: group.to_string(),
        table: crate::spark::lake::VIEW.to_string(),
        dir: String::new(),
        schema: Arc::new(Schema::empty()),
        columns: columns
            .iter()
            .filter(|c| column_of_group(c, group))
            .cloned()
            .collect(),
        tiers: Vec::new(),
        raw: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_told_apart_by_group() {
        let c = |n: &str| Column::parse(n).unwrap();
        assert!(column_of_group(&c("Ethernet0.IF_IN_OCTETS"), "PORT"));
        assert!(!column_of_group(&c("Ethernet0|3.PACKETS"), "PORT"));
        assert!(column_of_group(&c("Ethernet0|3.PACKETS"), "QUEUE"));
        assert!(!column_of_group(&c("Ethernet0.IF_IN_OCTETS"), "QUEUE"));
    }
}
