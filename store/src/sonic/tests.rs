use super::*;

#[test]
fn name_map_keys() {
    assert_eq!(name_map_key("Ethernet0|3"), "Ethernet0:3");
    assert_eq!(name_map_key("Ethernet0"), "Ethernet0");
    assert_eq!(name_map_key("a|b|7"), "a|b:7");
    assert_eq!(name_map_for(26), Some("COUNTERS_PG_NAME_MAP"));
    assert_eq!(name_map_for(21), Some("COUNTERS_QUEUE_NAME_MAP"));
    assert_eq!(name_map_for(99), None);
}

#[test]
fn config_validation_reports_every_problem() {
    let mut c = CountersDbConfig::for_test("unix:///nonexistent.sock");
    c.queue_batches = 0;
    c.map_refresh_ms = 0;
    let e = c.validate().unwrap_err().to_string();
    assert!(
        e.contains("queue_batches") && e.contains("map_refresh_ms"),
        "{e}"
    );
    let c = CountersDbConfig {
        url: "bogus://x".into(),
        ..CountersDbConfig::default()
    };
    assert!(matches!(c.validate(), Err(Error::Url { .. })));
}
