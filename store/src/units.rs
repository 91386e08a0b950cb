//! Durations and port speeds as people type them on command lines and in config files — one
//! parser for every binary (`stel-emu --period 10us`, `stel-query --last 1h30m`,
//! `--resolution 500ms`, `--speed 100G`, `[rollup] speed`).

/// Parses a port speed into Mb/s: `100G`, `25g`, `400M`, or a bare number of Mb/s (`400000`,
/// as SONiC's PORT table writes it).
///
/// # Errors
/// Anything else, a speed that is not above 0, or a bare number below 1000: read as Mb/s it
/// would be a port slower than 1G, and `--speed 400` means 400G far more often than 400 Mb/s
/// (write `400M` for that).
pub fn parse_speed_mbps(s: &str) -> Result<f64, String> {
    let t = s.trim().to_ascii_uppercase();
    let (num, mul, bare) = if let Some(n) = t.strip_suffix('G') {
        (n, 1000.0, false)
    } else if let Some(n) = t.strip_suffix('M') {
        (n, 1.0, false)
    } else {
        (t.as_str(), 1.0, true)
    };
    let v = num
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|v| *v > 0.0 && v.is_finite())
        .ok_or_else(|| format!("`{s}` is not a port speed (examples: 100G, 25G, 400000)"))?;
    if bare && v < 1000.0 {
        return Err(format!(
            "`{s}` is ambiguous: a bare number is Mb/s (SONiC's PORT speed, e.g. 400000), so it would be {v} Mb/s; write {v}G for {v} Gb/s, or {v}M if Mb/s is meant"
        ));
    }
    Ok(v * mul)
}

/// Parses a duration into ns: one or more `<number><unit>` parts (`10us`, `1.5s`, `1h30m`,
/// `1h 30m`), units `ns`, `us`/`µs`, `ms`, `s`, `m`/`min`, `h`, `d`. A bare number is refused,
/// as a bare port speed below 1G is: `--duration 10` meant seconds to whoever typed it, and read
/// as ns it stopped the daemon at once. (Config keys that are numbers by design, `…_ms`, `…_s`,
/// are not read through this.)
///
/// # Errors
/// A bare number (the message says which units to add), anything else, or a value beyond `u64`
/// ns (584 years); the message shows examples.
pub fn parse_duration_ns(s: &str) -> Result<u64, String> {
    let text = s.trim();
    let bad =
        |why: String| format!("`{s}` is not a duration ({why}); examples: 10us, 500ms, 30s, 1h30m");
    if text.is_empty() {
        return Err(bad("empty".into()));
    }
    if text.chars().all(|c| c.is_ascii_digit() || c == '.') && text.parse::<f64>().is_ok() {
        return Err(format!(
            "`{text}` has no unit: give one ({text}s, {text}ms, {text}us; also ns, m, h, d)"
        ));
    }
    let mut rest = text;
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (num, after) = rest.split_at(num_len);
        let v: f64 = num
            .parse()
            .map_err(|_| bad(format!("expected a number at `{rest}`")))?;
        let after = after.trim_start();
        let unit_len = after
            .find(|c: char| c.is_ascii_digit() || c == '.' || c.is_whitespace())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let mul = match unit {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" | "min" => 60e9,
            "h" => 3600e9,
            "d" => 86_400e9,
            "" => return Err(bad(format!("a unit is missing after `{num}`"))),
            u => {
                return Err(bad(format!(
                    "unknown unit `{u}`; use ns, us, ms, s, m, h, d"
                )))
            }
        };
        total += v * mul;
        rest = next.trim_start();
    }
    let ns = total.round();
    if !ns.is_finite() || ns >= u64::MAX as f64 {
        return Err(bad("too large".into()));
    }
    Ok(ns as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_duration_ns as p;

    #[test]
    fn speeds_parse() {
        use super::parse_speed_mbps as s;
        assert_eq!(s("100G"), Ok(100_000.0));
        assert_eq!(s(" 25g "), Ok(25_000.0));
        assert_eq!(s("400M"), Ok(400.0));
        assert_eq!(s("400000"), Ok(400_000.0));
        assert_eq!(s("1000"), Ok(1_000.0));
        for bad in ["", "fast", "0G", "-1", "infG"] {
            assert!(s(bad).is_err(), "{bad}");
        }
        // A bare number below 1000 is a unit left out, not a sub-gigabit port.
        let e = s("400").unwrap_err();
        assert!(e.contains("400G") && e.contains("400M"), "{e}");
        assert_eq!(s("100M"), Ok(100.0));
    }

    #[test]
    fn durations_parse() {
        assert_eq!(p("10us"), Ok(10_000));
        assert_eq!(p("10µs"), Ok(10_000));
        // A bare number has no unit to assume: refused, naming the units to add.
        let e = p("10").unwrap_err();
        assert!(
            e.contains("no unit: give one") && e.contains("10s") && e.contains("10ms"),
            "{e}"
        );
        assert!(p("0.5").unwrap_err().contains("0.5s"));
        assert_eq!(p(" 250ns "), Ok(250));
        assert_eq!(p("1.5s"), Ok(1_500_000_000));
        assert_eq!(p("1m"), Ok(60_000_000_000));
        assert_eq!(p("2min"), Ok(120_000_000_000));
        assert_eq!(p("1h30m"), Ok(5_400_000_000_000));
        assert_eq!(p("1h 30m"), Ok(5_400_000_000_000));
        assert_eq!(p("1d"), Ok(86_400_000_000_000));
        for bad in [
            "",
            "ten",
            "3 parsecs",
            "1h30",
            "5 5",
            "1e3s",
            "99999999999d",
            "-1s",
            ".",
        ] {
            assert!(p(bad).is_err(), "{bad}");
        }
    }
}
