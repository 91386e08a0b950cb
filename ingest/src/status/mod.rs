//! The daemon's own figures in the metrics registry ([`stel_store::metrics`]), published once
//! per status tick from the [`DaemonStatus`] the main loop already builds (and from the INT
//! source's counters), so `/metrics` (Prometheus), OTLP's own-metrics export and the status
//! file tell the same numbers. Not on the data path: one registry lookup per series per tick.
//!
//! Labels are bounded: the source kind, reasons from closed enums, sink names.
//!
//! [`crate::report`] turns the registry's snapshot into the status file, the status line and
//! what `stel-ingestd status` prints.
use std::{
    borrow::Cow,
    collections::HashMap,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::SystemTime,
};

use stel_store::{
    labels,
    metrics::{Counter, Gauge, Kind, Label, Metric, Registry},
};

use crate::{
    config::SourceKind, daemon::DaemonStatus, decode::Malformed, int::source::IntSourceStats,
    sources::state_db::StateDbStats,
};

/// The bounded `source` label value of a source kind.
pub fn source_label(k: SourceKind) -> &'static str {
    match k {
        SourceKind::Genl => "genl",
        SourceKind::Usersock => "usersock",
        SourceKind::Demo => "demo",
        SourceKind::File => "file",
        SourceKind::None => "none",
    }
}

/// Whether the data path is live, as `/health` reports it: set by the main loop each tick;
/// a main loop that stops ticking makes it unhealthy by itself.
#[derive(Debug)]
pub struct Health {
    /// Unix seconds of the main loop's last tick.
    last_tick_s: AtomicU64,
    verdict: Mutex<Result<(), String>>,
    /// Longest a tick may be late before the data path counts as stalled, s.
    stall_s: u64,
}

fn unix_s() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Health {
    pub fn new(stall_s: u64) -> Arc<Self> {
        Arc::new(Self {
            last_tick_s: AtomicU64::new(unix_s()),
            verdict: Mutex::new(Ok(())),
            stall_s,
        })
    }

    /// The main loop's verdict this tick.
    pub fn set(&self, v: Result<(), String>) {
        self.last_tick_s.store(unix_s(), Ordering::Relaxed);
        *self.verdict.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }

    /// `Ok` while live; else why not (for `/health`'s 503 body).
    pub fn check(&self) -> Result<(), String> {
        let late = unix_s().saturating_sub(self.last_tick_s.load(Ordering::Relaxed));
        if late > self.stall_s {
            return Err(format!(
                "the main loop has not ticked for {late} s (reader stalled)"
            ));
        }
        self.verdict
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Publishes a tick's figures into the registry: the reader thread's status (reader, input,
/// filter, dispatch, decode, sessions), the STATE_DB watcher's and the INT source's counters.
/// The sinks, the live view and the inspect socket register their own handles in the same
/// registry when they start; everything the status file, the status line, `stel-ingestd
/// status`, `/metrics` and OTLP show is then one [`Registry::snapshot`].
///
/// The decoders keep plain per-thread totals (published per batch to the reader thread, see
/// `pipeline`); this copies them into their series once per tick with a relaxed store each.
/// Handles are looked up once and cached, so a tick costs no registry lock after the first.
#[derive(Debug)]
pub struct StatusMetrics {
    registry: Arc<Registry>,
    source: &'static str,
    handles: Mutex<HashMap<SeriesKey, Handle>>,
}

/// A series: its metric and label values.
type SeriesKey = (Metric, Vec<Cow<'static, str>>);

#[derive(Debug, Clone)]
enum Handle {
    Counter(Counter),
    Gauge(Gauge),
}

impl StatusMetrics {
    pub fn new(registry: Arc<Registry>, source: SourceKind) -> Self {
        Self {
            registry,
            source: source_label(source),
            handles: Mutex::default(),
        }
    }

    fn handle(&self, m: Metric, labels: &[(Label, Cow<'static, str>)]) -> Handle {
        let key = (m, labels.iter().map(|(_, v)| v.clone()).collect::<Vec<_>>());
        let mut g = self.handles.lock().unwrap_or_else(|e| e.into_inner());
        g.entry(key)
            .or_insert_with(|| match m.kind() {
                Kind::Gauge => Handle::Gauge(self.registry.gauge(m, labels)),
                _ => Handle::Counter(self.registry.counter(m, labels)),
            })
            .clone()
    }

    /// Sets a counter series to the total its owner keeps.
    fn total(&self, m: Metric, labels: &[(Label, Cow<'static, str>)], v: u64) {
        if let Handle::Counter(c) = self.handle(m, labels) {
            c.set_total(v);
        }
    }

    /// Sets a gauge series.
    fn level(&self, m: Metric, labels: &[(Label, Cow<'static, str>)], v: u64) {
        if let Handle::Gauge(g) = self.handle(m, labels) {
            g.set(v);
        }
    }

    /// Sets every series from this tick's status (`healthy`: what `/health` says now).
    pub fn publish(&self, st: &DaemonStatus, int: Option<&IntSourceStats>, healthy: bool) {
        use Metric as M;
        let src = self.source;
        let r = &st.recv;
        self.total(M::ReaderDatagrams, labels!(Source = src), r.datagrams);
        self.total(M::ReaderBytes, labels!(Source = src), r.bytes);
        self.total(
            M::ReaderTruncatedDatagrams,
            labels!(Source = src),
            r.truncated,
        );
        self.total(
            M::ReaderKernelDroppedDatagrams,
            labels!(Source = src),
            st.kernel_drops,
        );
        self.total(
            M::ReaderRearms,
            labels!(Source = src, Reason = "no_buffers"),
            r.rearms_no_buffers,
        );
        self.total(
            M::ReaderRearms,
            labels!(Source = src, Reason = "kernel"),
            r.rearms,
        );
        self.total(M::ReaderErrors, labels!(Source = src), r.errors);
        self.total(M::ReaderSlotWaits, labels!(Source = src), r.no_free_slot);
        self.total(M::ReaderPolls, labels!(Source = src), r.polls);
        self.level(
            M::ReaderReceiveGapMaxMicroseconds,
            labels!(Source = src),
            st.receive_gap_max_us,
        );
        self.total(
            M::ReaderReceiveGapsOver10ms,
            labels!(Source = src),
            st.receive_gaps_over_10ms,
        );
        if let Some(i) = &st.input {
            self.total(M::InputFiles, labels!(), i.files);
            self.total(M::InputFailedFiles, labels!(), i.files_failed);
            self.total(M::InputReadBytes, labels!(), i.bytes_read);
            self.total(M::InputUnits, labels!(), i.units);
            self.total(M::InputUnreadableRecords, labels!(), i.unreadable_records);
            self.total(M::InputDiscardedBytes, labels!(), i.discarded_bytes);
            self.total(M::InputSkippedPackets, labels!(), i.skipped_packets);
            self.total(M::InputNonIpfixDatagrams, labels!(), i.non_ipfix_datagrams);
            self.total(M::InputIntDatagrams, labels!(), i.int_datagrams);
            self.total(
                M::InputUnroutedIntDatagrams,
                labels!(),
                st.int_datagrams_unrouted,
            );
            self.total(M::InputIpFragments, labels!(), i.ip_fragments);
            self.total(M::InputReassembledDatagrams, labels!(), i.ip_reassembled);
            self.total(
                M::InputDroppedIpFragments,
                labels!(),
                i.ip_fragments_dropped,
            );
        }
        let f = &st.filter;
        self.total(M::FilterSeenMessages, labels!(), f.seen);
        self.total(M::FilterKeptMessages, labels!(), f.kept);
        self.total(M::FilterDroppedMessages, labels!(), f.dropped);
        self.total(M::FilterTooShortMessages, labels!(), f.too_short);
        self.total(M::FilterLearnedTemplates, labels!(), f.learned);
        self.total(M::FilterLearnFailedTemplates, labels!(), f.learn_failed);
        self.level(M::FilterTemplates, labels!(), f.templates as u64);
        self.level(M::FilterMaxTemplates, labels!(), u64::from(f.max_templates));
        self.level(
            M::FilterKernelState,
            labels!(),
            u64::from(f.kind == "kernel"),
        );

        let p = &st.pipeline.dispatch;
        self.total(M::DispatchMessages, labels!(), p.messages);
        self.total(M::DispatchControlFrames, labels!(), p.control_frames);
        self.total(
            M::DispatchShedMessages,
            labels!(Reason = "decoder_full"),
            p.shed_decoder_full_messages,
        );
        self.total(
            M::DispatchShedBytes,
            labels!(Reason = "decoder_full"),
            p.shed_decoder_full_bytes,
        );
        self.total(M::DispatchStalls, labels!(), p.stalls);
        self.total(M::DispatchDeferredControls, labels!(), p.control_deferred);

        let d = &st.pipeline.decode;
        self.total(M::DecodeMessages, labels!(), d.messages);
        self.total(M::DecodeBytes, labels!(), d.bytes);
        self.total(M::DecodeRecords, labels!(), d.records);
        for (core, v) in st.pipeline.per_decoder_counters.iter().enumerate() {
            self.total(M::DecodeValues, labels!(Core = core.to_string()), *v);
        }
        self.total(M::DecodeBatches, labels!(), d.batches);
        self.total(M::DecodeTemplateSets, labels!(), d.template_sets);
        self.total(
            M::DecodeOptionsTemplateSets,
            labels!(),
            d.options_template_sets,
        );
        for (reason, v) in [
            ("registered", d.templates_registered),
            ("refreshed", d.templates_refreshed),
            ("replaced", d.templates_replaced),
            ("withdrawn", d.templates_withdrawn),
            ("options", d.options_templates),
        ] {
            self.total(M::DecodeTemplates, labels!(Reason = reason), v);
        }
        self.total(M::DecodeOptionsRecords, labels!(), d.options_records);
        self.total(M::DecodeAppliedSessions, labels!(), d.sessions_registered);
        self.total(
            M::DecodeUnknownTemplateBytes,
            labels!(),
            d.unknown_template_bytes,
        );
        self.total(M::DecodePaddingBytes, labels!(), d.padding_bytes);
        self.total(M::DecodeDiscardedBytes, labels!(), d.discarded_bytes);
        self.total(M::DecodeMissingSamples, labels!(), d.missing_samples);
        self.total(
            M::DecodeSessionOverrides,
            labels!(),
            d.templates_overriding_session,
        );
        for r in Malformed::ALL {
            self.total(
                M::DecodeMalformed,
                labels!(Reason = r.name()),
                d.malformed(r),
            );
        }
        self.total(M::DecodeSeqLostMessages, labels!(), d.seq_lost_messages);
        self.total(M::DecodeSeqLostRecords, labels!(), d.seq_lost_records);
        self.total(M::DecodeSeqGaps, labels!(), d.seq_gap_events);
        self.total(
            M::DecodeSeqOutOfOrderMessages,
            labels!(),
            d.seq_out_of_order,
        );
        self.total(M::DecodeSeqFilteredMessages, labels!(), d.filtered_messages);
        self.total(M::DecodeSeqResets, labels!(), d.seq_resets);
        self.total(
            M::DecodeSeqConcurrentDomains,
            labels!(),
            d.seq_concurrent_domains,
        );
        self.total(M::DecodeSeqEvictedDomains, labels!(), d.seq_evicted_domains);
        self.total(M::DecodeEvictedTemplates, labels!(), d.templates_evicted);
        self.total(
            M::DecodeEvictedBatchBuffers,
            labels!(),
            d.batch_buffers_evicted,
        );

        let s = &st.session_registry;
        self.level(M::SessionRegisteredSessions, labels!(), st.sessions as u64);
        self.level(M::SessionApplyingSessions, labels!(), s.applying as u64);
        self.total(
            M::SessionAcceptedRegistrations,
            labels!(),
            s.registrations_total,
        );
        self.total(M::SessionAppliedRegistrations, labels!(), s.applied_total);
        self.total(M::SessionRejectedRegistrations, labels!(), s.rejected_total);
        self.total(
            M::SessionUnregistrations,
            labels!(),
            s.unregistrations_total,
        );
        self.total(
            M::SessionFilterRollbacks,
            labels!(),
            s.filter_rollbacks_total,
        );
        self.total(
            M::SessionFilterRemoveErrors,
            labels!(),
            s.filter_remove_errors_total,
        );
        self.level(
            M::DaemonCapabilitiesDroppedState,
            labels!(),
            u64::from(st.capabilities_dropped),
        );
        self.level(
            M::DaemonDecoderThreads,
            labels!(),
            st.pipeline.per_decoder_counters.len() as u64,
        );

        if let Some(i) = int {
            self.publish_int(i);
        }
        self.level(M::DaemonHealthyState, labels!(), u64::from(healthy));
    }

    /// The INT source's counters (with `[int]`): its receive loop as the reader's with
    /// `source="int"`, its decoders', its report filter's, and its tables sink's (the generic
    /// sink series with `sink="int"`, the rest as `stel_int_*`).
    fn publish_int(&self, i: &IntSourceStats) {
        use Metric as M;
        let src = labels!(Source = "int");
        let r = &i.recv;
        self.total(M::ReaderDatagrams, src, r.datagrams);
        self.total(M::ReaderBytes, src, r.bytes);
        self.total(M::ReaderTruncatedDatagrams, src, r.truncated);
        self.total(M::ReaderKernelDroppedDatagrams, src, i.kernel_drops);
        self.total(
            M::ReaderRearms,
            labels!(Source = "int", Reason = "no_buffers"),
            r.rearms_no_buffers,
        );
        self.total(
            M::ReaderRearms,
            labels!(Source = "int", Reason = "kernel"),
            r.rearms,
        );
        self.total(M::ReaderErrors, src, r.errors);
        self.total(M::ReaderSlotWaits, src, r.no_free_slot);
        self.total(M::ReaderPolls, src, r.polls);

        let d = &i.decode;
        self.level(M::IntDecoders, labels!(), i.sockets as u64);
        self.total(M::IntDatagrams, labels!(), d.payloads);
        self.total(M::IntBytes, labels!(), d.bytes);
        for (v, n) in [
            ("0.5", d.reports_v05),
            ("1.0", d.reports_v1),
            ("2.0", d.reports_v2),
        ] {
            self.total(M::IntVersionDatagrams, labels!(Version = v), n);
        }
        self.total(M::IntReports, labels!(), d.reports);
        self.total(M::IntGroDatagrams, labels!(), d.gro_datagrams);
        self.total(M::IntGroReceives, labels!(), d.gro_receives);
        self.total(M::IntDecodedReports, labels!(), d.reports_decoded);
        self.total(M::IntDecodedHops, labels!(), d.hops);
        self.total(M::IntDecodedDropReports, labels!(), d.drops);
        for r in crate::int::Malformed::ALL {
            self.total(
                M::IntMalformedReports,
                labels!(Reason = r.name()),
                d.malformed(*r),
            );
        }
        for (m, v) in [
            (M::IntStackReports, d.int_stacks),
            (M::IntUnsignalledReports, d.int_not_signalled),
            (M::IntMxOrDestinationHeaders, d.int_mx_or_destination),
            (M::IntTcpIntBeforeOptionsReports, d.tcp_int_before_options),
            (M::IntUnknownInstructionBits, d.unknown_instruction_bits),
            (M::IntHopCountMismatchReports, d.hop_count_rhc_mismatch),
            (M::IntReservedMdBits, d.v2_reserved_md_bits),
            (
                M::IntSkippedDomainSpecificBytes,
                d.domain_specific_bytes_skipped,
            ),
            (M::IntSkippedV2Reports, d.v2_reports_skipped),
            (M::IntSkippedGroupBytes, d.v2_group_bytes_skipped),
            (M::IntNegativeLatencyHops, d.negative_hop_latency),
            (M::IntSeqLostReports, d.seq_lost),
            (M::IntSeqReorderedReports, d.seq_reordered),
            (M::IntSeqDuplicateReports, d.seq_duplicates),
            (M::IntSeqStaleReports, d.seq_stale),
            (M::IntSeqResyncs, d.seq_resyncs),
            (M::IntSeqSuspectReports, d.seq_suspect),
            (M::IntEvictedFlows, d.flows_evicted),
            (M::IntExpiredFlows, d.flows_expired),
            (M::IntPathChanges, d.path_changes),
            (M::IntEvcMatchedReports, d.evc_matched),
            (M::IntEvcUnmatchedReports, d.evc_unmatched),
        ] {
            self.total(m, labels!(), v);
        }
        self.level(M::IntSeqPendingReports, labels!(), d.seq_pending);
        self.level(M::IntTrackedFlows, labels!(), d.flows);
        self.level(M::IntSeqStreams, labels!(), d.seq_streams);
        for (why, n) in [
            ("idle", d.seq_streams_expired),
            ("full", d.seq_streams_evicted),
        ] {
            self.total(M::IntSeqDroppedStreams, labels!(Reason = why), n);
        }
        self.total(
            M::IntLatencyCrossings,
            labels!(Reason = "up"),
            d.latency_crossings_up,
        );
        self.total(
            M::IntLatencyCrossings,
            labels!(Reason = "down"),
            d.latency_crossings_down,
        );
        self.level(M::IntEvcs, labels!(), i.evcs as u64);
        self.total(M::IntEvcReloads, labels!(Reason = "ok"), i.evc_reloads);
        self.total(
            M::IntEvcReloads,
            labels!(Reason = "failed"),
            i.evc_reload_failures,
        );
        if let Some(f) = &i.filter {
            self.total(M::IntFilterSeenDatagrams, labels!(), f.seen_datagrams);
            self.total(M::IntFilterKeptDatagrams, labels!(), f.kept_datagrams);
            self.total(
                M::IntFilterDroppedDatagrams,
                labels!(Reason = "version"),
                f.dropped_version_datagrams,
            );
            self.total(
                M::IntFilterDroppedDatagrams,
                labels!(Reason = "source"),
                f.dropped_source_datagrams,
            );
            self.total(M::IntFilterEmptyDatagrams, labels!(), f.empty_datagrams);
        }

        let k = &i.sink;
        let sink = labels!(Sink = "int");
        self.total(M::SinkReceivedBatches, sink, k.batches_submitted);
        self.total(M::SinkReceivedSamples, sink, k.rows_submitted);
        self.total(M::SinkQueuedBatches, sink, k.batches_queued);
        self.total(M::SinkDequeuedBatches, sink, k.batches_dequeued);
        self.level(M::SinkQueuedBytes, sink, k.queued_bytes);
        for (reason, v) in [
            ("queue_full", k.shed_queue_full_rows),
            ("queue_timeout", k.shed_queue_timeout_rows),
            ("memory_budget", k.shed_memory_budget_rows),
            ("closed", k.shed_closed_rows),
            ("switch_limit", k.shed_switch_limit_rows),
            ("switch_rate", k.shed_switch_rate_rows),
            ("disk_full", k.lost_disk_full_rows),
            ("write_error", k.lost_write_error_rows),
        ] {
            self.total(
                M::SinkDroppedSamples,
                labels!(Sink = "int", Reason = reason),
                v,
            );
        }
        self.total(M::SinkDeliveredSamples, sink, k.rows_written);
        self.total(M::SinkPublishedFiles, sink, k.files_published);
        self.total(M::IntPublishedBytes, labels!(), k.bytes_published);
        self.total(M::IntWriteErrors, labels!(), k.write_errors);
        for (reason, v) in [
            ("hour", k.rotations_hour),
            ("size", k.rotations_size),
            ("age", k.rotations_age),
            ("idle", k.rotations_idle),
        ] {
            self.total(M::IntRotations, labels!(Reason = reason), v);
        }
        self.level(M::IntOpenSwitches, labels!(), k.open_switches);
        self.level(M::IntOpenFiles, labels!(), k.open_files);
        self.total(M::IntSwitchRefusals, labels!(), k.switch_refusals);
        self.total(M::IntBudgetFlushes, labels!(), k.budget_row_group_flushes);
        self.level(M::IntBufferedBytes, labels!(), k.writer_bytes);
        self.total(M::IntStaleTempFiles, labels!(), k.stale_temp_files_removed);
        self.total(M::IntStaleTempBytes, labels!(), k.stale_temp_bytes_removed);
        self.total(M::IntRetentionFiles, labels!(), k.retention_files_deleted);
        self.total(M::IntRetentionBytes, labels!(), k.retention_bytes_deleted);
        self.level(M::IntHistoryBytes, labels!(), k.history_bytes);
    }

    /// The STATE_DB watcher's counters (with `[state_db]`).
    pub fn publish_state_db(&self, s: &StateDbStats) {
        use Metric as M;
        self.total(M::StateDbScans, labels!(), s.full_scans);
        self.total(M::StateDbNotifications, labels!(), s.notifications);
        self.total(M::StateDbEvents, labels!(Reason = "register"), s.registers);
        self.total(
            M::StateDbEvents,
            labels!(Reason = "unregister"),
            s.unregisters,
        );
        self.total(
            M::StateDbIgnoredEntries,
            labels!(Reason = "malformed"),
            s.bad_entries,
        );
        self.total(
            M::StateDbIgnoredEntries,
            labels!(Reason = "unsupported_type"),
            s.unsupported_type,
        );
        self.total(M::StateDbAcks, labels!(), s.acks_written);
        self.total(M::StateDbRejects, labels!(), s.rejects);
        self.total(M::StateDbErrors, labels!(), s.redis_errors);
        self.total(M::StateDbConnects, labels!(), s.connects);
        self.total(
            M::StateDbNotificationEnables,
            labels!(),
            s.notifications_enabled_by_us,
        );
        self.level(M::StateDbConnectedState, labels!(), u64::from(s.connected));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::filter::int::IntFilterStatus;

    /// The INT source's figures reach their series, and the status line's INT part reads them
    /// back from two snapshots.
    #[test]
    fn int_figures_are_series_and_the_line_reads_them() {
        let registry = Registry::new();
        let m = StatusMetrics::new(Arc::clone(&registry), SourceKind::None);
        let mut i = IntSourceStats {
            sockets: 2,
            kernel_drops: 4,
            evcs: 8,
            evc_reloads: 1,
            ..IntSourceStats::default()
        };
        i.recv.datagrams = 1000;
        i.decode.reports = 1000;
        i.decode.reports_v1 = 990;
        i.decode.count(crate::int::Malformed::Empty);
        i.decode.count(crate::int::Malformed::V1LengthTooSmall);
        i.decode.seq_lost = 7;
        i.decode.flows = 3;
        i.decode.latency_crossings_down = 2;
        i.sink.shed_queue_full_rows = 5;
        i.sink.shed_closed_rows = 1;
        i.sink.lost_disk_full_rows = 9;
        i.filter = Some(IntFilterStatus {
            kind: "kernel",
            fallback_reason: None,
            seen_datagrams: 1010,
            kept_datagrams: 1000,
            dropped_version_datagrams: 6,
            dropped_source_datagrams: 4,
            empty_datagrams: 0,
        });
        let prev = registry.snapshot();
        m.publish_int(&i);
        let now = registry.snapshot();
        use Metric as M;
        assert_eq!(now.get(M::IntDecoders), 2);
        assert_eq!(
            now.sum_where(M::IntVersionDatagrams, Label::Version, "1.0"),
            990
        );
        assert_eq!(now.sum(M::IntMalformedReports), 2);
        assert_eq!(now.get(M::IntTrackedFlows), 3);
        assert_eq!(now.reason(M::IntLatencyCrossings, "down"), 2);
        assert_eq!(now.reason(M::IntEvcReloads, "ok"), 1);
        assert_eq!(now.get(M::IntEvcs), 8);
        assert_eq!(
            now.with_label(Label::Sink, "int")
                .reason(M::SinkDroppedSamples, "disk_full"),
            9
        );
        for metric in Metric::ALL {
            if matches!(metric.condition(), Some("[int]" | "[int.filter]")) {
                assert!(now.has(*metric), "{metric} not published");
            }
        }
        assert_eq!(
            crate::report::int_status_line(&now, &prev, 0.5, Some("kernel")).unwrap(),
            "int 2.0 k reports/s, 2 malformed, 7 seq lost, 4 kernel drops, 6 shed, 10 filtered (kernel)"
        );
        assert_eq!(
            crate::report::int_status_line(&prev, &prev, 1.0, None),
            None
        );
    }
}
