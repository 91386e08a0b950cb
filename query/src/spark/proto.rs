//! The few Spark Connect messages `stel-query` sends and reads, declared by hand with their field
//! numbers from Spark's `spark/connect/{base,relations,commands}.proto` (Spark 4.x; the numbers
//! have been stable since Spark Connect appeared in 3.4). Only what is used is declared: prost
//! skips every field it does not know, so a newer server's extra fields are harmless, and no
//! `protoc` or generated code is needed at build time.
//!
//! gRPC service `spark.connect.SparkConnectService`: `ExecutePlan` (server streaming) and
//! `AnalyzePlan` (unary).

use std::collections::HashMap;

/// Method paths of `spark.connect.SparkConnectService`.
pub(crate) const EXECUTE_PLAN: &str = "/spark.connect.SparkConnectService/ExecutePlan";
pub(crate) const ANALYZE_PLAN: &str = "/spark.connect.SparkConnectService/AnalyzePlan";

/// `spark.connect.UserContext`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct UserContext {
    #[prost(string, tag = "1")]
    pub user_id: String,
    #[prost(string, tag = "2")]
    pub user_name: String,
}

/// `spark.connect.SQL` (a relation): the query text.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Sql {
    #[prost(string, tag = "1")]
    pub query: String,
}

/// `spark.connect.Relation`, only its `sql` case (field 10 of the `rel_type` oneof).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Relation {
    #[prost(oneof = "RelType", tags = "10")]
    pub rel_type: Option<RelType>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum RelType {
    #[prost(message, tag = "10")]
    Sql(Sql),
}

/// `spark.connect.Plan`: `root` (field 1 of the `op_type` oneof).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Plan {
    #[prost(oneof = "OpType", tags = "1")]
    pub op_type: Option<OpType>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum OpType {
    #[prost(message, tag = "1")]
    Root(Relation),
}

impl Plan {
    /// A plan whose root is the relation of `query` (Spark runs DDL in it eagerly, like
    /// `spark.sql`).
    pub(crate) fn sql(query: &str) -> Self {
        Self {
            op_type: Some(OpType::Root(Relation {
                rel_type: Some(RelType::Sql(Sql {
                    query: query.to_string(),
                })),
            })),
        }
    }
}

/// `spark.connect.ExecutePlanRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExecutePlanRequest {
    #[prost(string, tag = "1")]
    pub session_id: String,
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    #[prost(message, optional, tag = "3")]
    pub plan: Option<Plan>,
    #[prost(string, optional, tag = "4")]
    pub client_type: Option<String>,
    #[prost(string, optional, tag = "6")]
    pub operation_id: Option<String>,
}

/// `spark.connect.ExecutePlanResponse`: result batches, metrics, completion; the other response
/// types (streaming, ML, progress, …) are skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExecutePlanResponse {
    #[prost(string, tag = "1")]
    pub session_id: String,
    #[prost(message, optional, tag = "2")]
    pub arrow_batch: Option<ArrowBatch>,
    #[prost(message, optional, tag = "4")]
    pub metrics: Option<Metrics>,
    #[prost(message, optional, tag = "14")]
    pub result_complete: Option<ResultComplete>,
}

/// `ExecutePlanResponse.ArrowBatch`: one Arrow IPC stream (schema + batches).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ArrowBatch {
    #[prost(int64, tag = "1")]
    pub row_count: i64,
    #[prost(bytes = "vec", tag = "2")]
    pub data: Vec<u8>,
}

/// `ExecutePlanResponse.ResultComplete` (empty).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ResultComplete {}

/// `ExecutePlanResponse.Metrics`: the executed plan's nodes and their SQL metrics.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Metrics {
    #[prost(message, repeated, tag = "1")]
    pub metrics: Vec<MetricObject>,
}

/// `Metrics.MetricObject`: one plan node.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MetricObject {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int64, tag = "2")]
    pub plan_id: i64,
    #[prost(int64, tag = "3")]
    pub parent: i64,
    #[prost(map = "string, message", tag = "4")]
    pub execution_metrics: HashMap<String, MetricValue>,
}

/// `Metrics.MetricValue`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MetricValue {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int64, tag = "2")]
    pub value: i64,
    #[prost(string, tag = "3")]
    pub metric_type: String,
}

/// `spark.connect.AnalyzePlanRequest` with the three analyses used: `explain` (5),
/// `input_files` (9), `spark_version` (10).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AnalyzePlanRequest {
    #[prost(string, tag = "1")]
    pub session_id: String,
    #[prost(message, optional, tag = "2")]
    pub user_context: Option<UserContext>,
    #[prost(string, optional, tag = "3")]
    pub client_type: Option<String>,
    #[prost(oneof = "Analyze", tags = "5, 9, 10")]
    pub analyze: Option<Analyze>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum Analyze {
    #[prost(message, tag = "5")]
    Explain(Explain),
    #[prost(message, tag = "9")]
    InputFiles(InputFiles),
    #[prost(message, tag = "10")]
    SparkVersion(SparkVersionRequest),
}

/// `AnalyzePlanRequest.Explain`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Explain {
    #[prost(message, optional, tag = "1")]
    pub plan: Option<Plan>,
    /// `ExplainMode`: 1 simple, 2 extended, 3 codegen, 4 cost, 5 formatted.
    #[prost(int32, tag = "2")]
    pub explain_mode: i32,
}

/// `AnalyzePlanRequest.InputFiles`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct InputFiles {
    #[prost(message, optional, tag = "1")]
    pub plan: Option<Plan>,
}

/// `AnalyzePlanRequest.SparkVersion` (empty).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SparkVersionRequest {}

/// `spark.connect.AnalyzePlanResponse`: `explain` (3), `input_files` (7), `spark_version` (8).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct AnalyzePlanResponse {
    #[prost(string, tag = "1")]
    pub session_id: String,
    #[prost(oneof = "AnalyzeResult", tags = "3, 7, 8")]
    pub result: Option<AnalyzeResult>,
}

#[derive(Clone, PartialEq, prost::Oneof)]
pub(crate) enum AnalyzeResult {
    #[prost(message, tag = "3")]
    Explain(ExplainResult),
    #[prost(message, tag = "7")]
    InputFiles(InputFilesResult),
    #[prost(message, tag = "8")]
    SparkVersion(SparkVersionResult),
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ExplainResult {
    #[prost(string, tag = "1")]
    pub explain_string: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct InputFilesResult {
    #[prost(string, repeated, tag = "1")]
    pub files: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SparkVersionResult {
    #[prost(string, tag = "1")]
    pub version: String,
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    /// The bytes of a request, field by field: Plan.root (1) → Relation.sql (10) → SQL.query (1).
    #[test]
    fn an_sql_plan_encodes_with_sparks_field_numbers() {
        let req = ExecutePlanRequest {
            session_id: "s".into(),
            plan: Some(Plan::sql("SELECT 1")),
            ..Default::default()
        };
        let b = req.encode_to_vec();
        // session_id: field 1, wire type 2.
        assert_eq!(&b[..3], &[0x0a, 1, b's']);
        // plan: field 3 (0x1a), len 14; root: field 1 (0x0a), len 12; sql: field 10 (0x52),
        // len 10; query: field 1 (0x0a), len 8, "SELECT 1".
        assert_eq!(
            &b[3..],
            &[
                0x1a, 14, 0x0a, 12, 0x52, 10, 0x0a, 8, b'S', b'E', b'L', b'E', b'C', b'T', b' ',
                b'1'
            ]
        );
        let back = ExecutePlanRequest::decode(b.as_slice()).unwrap();
        assert_eq!(back, req);
    }

    #[test]
    fn unknown_response_fields_are_skipped() {
        // result_complete (14) plus an unknown field 99 (varint) and schema (7, a message).
        let mut b = Vec::new();
        b.extend_from_slice(&[0x0a, 2, b'i', b'd']);
        b.extend_from_slice(&[0x98, 0x06, 5]); // field 99, varint 5
        b.extend_from_slice(&[0x3a, 0]); // field 7, empty message
        b.extend_from_slice(&[0x72, 0]); // field 14, empty message
        let r = ExecutePlanResponse::decode(b.as_slice()).unwrap();
        assert_eq!(r.session_id, "id");
        assert!(r.result_complete.is_some() && r.arrow_batch.is_none());
    }
}
