//! The OpenAPI 3.1 description of the API, served at `/v1/openapi.json`.

use serde_json::{Value, json};

fn op(summary: &str, auth: &str, responses: &[(&str, &str)]) -> Value {
    let mut r = serde_json::Map::new();
    for (code, what) in responses {
        r.insert((*code).to_owned(), json!({"description": what}));
    }
    r.insert(
        "default".into(),
        json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}),
    );
    json!({"summary": summary, "security": [{auth: []}], "responses": r})
}

fn with_body(mut op: Value, content_type: &str, schema: Value) -> Value {
    op["requestBody"] = json!({"required": true, "content": {content_type: {"schema": schema}}});
    op
}

fn with_params(mut op: Value, params: &[(&str, &str, &str, bool)]) -> Value {
    op["parameters"] = params
        .iter()
        .map(|(name, place, ty, required)| {
            json!({"name": name, "in": place, "required": required, "schema": {"type": ty}})
        })
        .collect();
    op
}

const ID: (&str, &str, &str, bool) = ("id", "path", "string", true);

/// The document.
pub(crate) fn document() -> Value {
    let tenant = "tenantToken";
    let admin = "adminToken";
    let mut doc = json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Statebox",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Multi-tenant stateful stream processing with sandboxed WebAssembly processors. Every request needs `Authorization: Bearer TOKEN`. Any request may answer 429 (too many of the caller's requests in flight) or 503 (too many over all callers), with Retry-After; a request body that stops arriving answers 408."
        },
        "paths": {
            "/v1/tenants": {
                "post": with_body(op("Create a tenant; returns its first API token (shown once)", admin, &[("201", "the tenant and its token")]), "application/json", json!({"$ref": "#/components/schemas/CreateTenant"})),
                "get": op("List tenants", admin, &[("200", "the tenants")]),
            },
            "/v1/tenants/{id}": {
                "get": with_params(op("Get a tenant", admin, &[("200", "the tenant")]), &[ID]),
                "delete": with_params(op("Delete a tenant with everything it has: its tokens stop working at once, its pipelines stop (one inside a processor call stops when the call returns) and are removed with their input, output and state, and its processors with their compiled artefacts", admin, &[("204", "deleted"), ("404", "no such tenant")]), &[ID]),
            },
            "/v1/tenants/{id}/tokens/{token}": {"delete": with_params(op("Revoke one of a tenant's API tokens (by its id, `tok_...`): requests with it answer 401 from now on", admin, &[("204", "revoked"), ("404", "no such tenant or token")]), &[ID, ("token", "path", "string", true)])},
            "/v1/tenants/{id}/quotas": {"patch": with_params(with_body(op("Change some of a tenant's quotas", admin, &[("200", "the tenant")]), "application/json", json!({"$ref": "#/components/schemas/Quotas"})), &[ID])},
            "/v1/tenants/{id}/tokens": {"post": with_params(op("Issue another API token", admin, &[("201", "the token (shown once)")]), &[ID])},
            "/v1/tenant": {"get": op("The calling tenant: quotas, the Kafka brokers granted to it, and usage", tenant, &[("200", "the tenant")])},
            "/v1/processors": {
                "post": with_body(op("Upload a processor component (checked, precompiled, stored by content hash)", tenant, &[("201", "the processor: id, output schema, state variables"), ("200", "the same component was uploaded before"), ("413", "larger than max_upload_bytes"), ("422", "not a valid processor component, with the reason")]), "application/wasm", json!({"type": "string", "format": "binary"})),
                "get": op("List processors", tenant, &[("200", "the processors")]),
            },
            "/v1/processors/{id}": {
                "get": with_params(op("Get a processor", tenant, &[("200", "the processor")]), &[ID]),
                "delete": with_params(op("Delete a processor (refused while a pipeline uses it)", tenant, &[("204", "deleted"), ("409", "in use")]), &[ID]),
            },
            "/v1/pipelines": {
                "post": with_body(op("Create and start a pipeline", tenant, &[("201", "the pipeline"), ("400", "invalid settings, with the reason"), ("403", "max_pipelines reached")]), "application/json", json!({"$ref": "#/components/schemas/CreatePipeline"})),
                "get": op("List pipelines with their status", tenant, &[("200", "the pipelines")]),
            },
            "/v1/pipelines/{id}": {
                "get": with_params(op("A pipeline's settings and status (with the last progress record)", tenant, &[("200", "the pipeline")]), &[ID]),
                "delete": with_params(op("Stop and delete a pipeline with its state and output", tenant, &[("204", "deleted")]), &[ID]),
            },
            "/v1/pipelines/{id}/rows": {"post": with_params(with_body(op("Ingest rows; acknowledged once durable in the pipeline's input log, then processed exactly once", tenant, &[("200", "{\"accepted\": N}"), ("400", "a bad row (none accepted)"), ("403", "state quota exceeded"), ("408", "the body stopped arriving"), ("413", "request too large"), ("429", "ingest rate limit (rows or bytes); see Retry-After"), ("503", "the pipeline is resuming after a restart; see Retry-After")]), "application/json", json!({"oneOf": [{"type": "array", "items": {"type": "object"}}, {"type": "string", "description": "JSON Lines"}]})), &[ID])},
            "/v1/pipelines/{id}/output": {"get": with_params(op("Committed output rows from byte offset `after`; pass `next` to read on", tenant, &[("200", "{rows, count, next, committed, end}")]), &[ID, ("after", "query", "integer", false), ("limit", "query", "integer", false)])},
            "/v1/pipelines/{id}/progress": {"get": with_params(op("The last batches' progress records", tenant, &[("200", "{progress: [...]}")]), &[ID, ("last", "query", "integer", false)])},
            "/v1/pipelines/{id}/stop": {"post": with_params(op("Stop after the current batch", tenant, &[("200", "the pipeline")]), &[ID])},
            "/v1/pipelines/{id}/start": {"post": with_params(op("Start (or restart a failed pipeline)", tenant, &[("200", "the pipeline"), ("409", "the engine refused to start it, with the reason")]), &[ID])},
            "/v1/pipelines/{id}/processor": {"put": with_params(with_body(op("Upgrade to another processor after the compatibility check. An outbound-HTTP grant belongs to the component it was given for: upgrading to another component drops it (`http_grant_dropped`) until the admin grants again", tenant, &[("200", "upgraded, with the report and `http_grant_dropped`"), ("409", "incompatible; the report says why")]), "application/json", json!({"type": "object", "properties": {"processor": {"type": "string"}}, "required": ["processor"]})), &[ID])},
            "/v1/pipelines/{id}/kafka/options": {"put": with_params(with_body(op("Replace the Kafka client options of a pipeline's source, sink or both (each side given gets the complete list), e.g. to rotate SASL credentials. Brokers and topics stay, so offsets and the sink's transactions carry on. A `sasl.password` of `<redacted>`, as the pipeline's JSON shows it, keeps the stored password. A running pipeline restarts with the new options after its current batch; a stopped or failed one gets them at its next start", tenant, &[("200", "the pipeline, with `restarted`"), ("400", "no side given, a side that is not Kafka, or `<redacted>` without a stored password"), ("422", "a client option that is not allowed"), ("409", "stored, but the pipeline could not restart")]), "application/json", json!({"$ref": "#/components/schemas/KafkaOptions"})), &[ID])},
            "/v1/pipelines/{id}/capabilities": {"put": with_params(with_body(op("Grant a pipeline's processor outbound HTTP (wasi:http) to an allow-list of hosts, replacing the previous list (admin only: tenants cannot grant themselves). The grant is for the component the pipeline runs now (`http_hosts_for`, its BLAKE3); an upgrade to another component drops it. Processors get nothing by default: a request to a host not on the list fails in the guest with the wasi:http error `HTTP-request-denied`. An allowed request is bounded by the call's CPU deadline. A running pipeline restarts on the new grant. Replays of a batch are deterministic only as far as the services called are", admin, &[("200", "the pipeline, with `http_hosts` and `restarted`"), ("400", "an invalid host"), ("403", "not the admin token"), ("409", "stored, but the pipeline could not restart")]), "application/json", json!({"$ref": "#/components/schemas/Capabilities"})), &[ID])},
            "/v1/pipelines/{id}/state": {"get": with_params(op("A state variable's rows (or the timers) at the latest or a retained batch", tenant, &[("200", "{rows, truncated}")]), &[ID, ("var", "query", "string", false), ("timers", "query", "boolean", false), ("flatten", "query", "boolean", false), ("batch_id", "query", "integer", false), ("limit", "query", "integer", false)])},
            "/v1/pipelines/{id}/state/changes": {"get": with_params(op("A state variable's change feed", tenant, &[("200", "{rows, truncated}")]), &[ID, ("var", "query", "string", true), ("from", "query", "integer", true), ("to", "query", "integer", false), ("limit", "query", "integer", false)])},
            "/v1/pipelines/{id}/state/metadata": {"get": with_params(op("The checkpoint's metadata: operator, partitions, batches, modes, variables and schema history", tenant, &[("200", "the metadata")]), &[ID])},
            "/v1/whoami": {"get": op("Whose token this is: {role: admin} or {role: tenant, tenant, name} (either token)", tenant, &[("200", "the caller")])},
            "/v1/usage": {"get": op("Every tenant's quotas, Kafka brokers granted, usage (processors, pipelines, state bytes, CPU seconds, memory high water, refused requests) and pipelines", admin, &[("200", "{tenants: [...]}")])},
            "/v1/pipelines/{id}/processor/check": {"post": with_params(with_body(op("The compatibility report of an upgrade, without upgrading", tenant, &[("200", "{compatible, report, processor, current_processor}"), ("422", "the processor cannot be loaded")]), "application/json", json!({"type": "object", "properties": {"processor": {"type": "string"}}, "required": ["processor"]})), &[ID])},
            "/v1/pipelines/{id}/output/tail": {"get": with_params(op("The latest committed output rows ending at byte offset `before` (default: the end); pass `from` as `before` to page back", tenant, &[("200", "{rows, count, from, to, committed, begin}")]), &[ID, ("before", "query", "integer", false), ("limit", "query", "integer", false)])},
            "/v1/pipelines/{id}/sql": {"post": with_params(with_body(op("SQL over the pipeline's committed state (read_statestore, read_state_metadata); queries only", tenant, &[("200", "{columns, rows, count, truncated}"), ("400", "an invalid query, with the reason"), ("409", "no state yet"), ("501", "built without SQL")]), "application/json", json!({"type": "object", "properties": {"sql": {"type": "string"}, "limit": {"type": "integer", "default": 1000}}, "required": ["sql"]})), &[ID])},
            "/v1/openapi.json": {"get": op("This document", tenant, &[("200", "OpenAPI 3.1")])},
            "/metrics": {"get": op("Prometheus metrics", admin, &[("200", "text exposition format")])},
        },
        "components": {
            "securitySchemes": {
                "adminToken": {"type": "http", "scheme": "bearer"},
                "tenantToken": {"type": "http", "scheme": "bearer"},
            },
            "schemas": {
                "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {"code": {"type": "string"}, "message": {"type": "string"}}}}},
                "CreateTenant": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}, "quotas": {"$ref": "#/components/schemas/Quotas"}}},
                "Quotas": {"type": "object", "properties": {
                    "max_processors": {"type": "integer"}, "max_pipelines": {"type": "integer"},
                    "max_upload_bytes": {"type": "integer"}, "max_ingest_request_bytes": {"type": "integer"},
                    "max_state_bytes": {"type": "integer"}, "call_cpu_ms": {"type": "integer"},
                    "batch_cpu_ms": {"type": "integer"}, "memory_bytes": {"type": "integer"},
                    "output_bytes_per_call": {"type": "integer"}, "ingest_rows_per_s": {"type": "integer"},
                    "ingest_bytes_per_s": {"type": "integer", "description": "sustained ingest bytes per second (429 beyond)"},
                    "max_batch_bytes": {"type": "integer", "description": "input bytes one batch reads at most, cut at a line boundary"},
                    "max_workers": {"type": "integer", "description": "threads one pipeline's batch runs its partitions on at most (never more than the machine's cores)"},
                    "max_disk_bytes": {"type": "integer", "description": "bytes on disk over the tenant's pipelines (input, output, state) and processors (403 beyond)"},
                    "output_retention_bytes": {"type": "integer", "description": "committed output a pipeline keeps at most (default 1 GiB); older rows are dropped, whole segments at a time"},
                    "output_retention_ms": {"type": "integer", "description": "age after which committed output is dropped (default 7 days)"},
                    "state_cache_bytes": {"type": "integer", "description": "committed state one pipeline keeps in memory in front of its database (default 32 MiB; 0: none)"}
                }},
                "KafkaOptions": {"type": "object", "properties": {
                    "source": {"type": "object", "additionalProperties": {"type": "string"}, "description": "The source's librdkafka options (authentication and `client.id` only)"},
                    "sink": {"type": "object", "additionalProperties": {"type": "string"}, "description": "The sink's librdkafka options (authentication and `client.id` only)"}
                }},
                "Capabilities": {"type": "object", "required": ["http_hosts"], "properties": {
                    "http_hosts": {"type": "array", "items": {"type": "string", "description": "`HOST` (any port) or `HOST:PORT`; an IPv6 address in brackets"}, "description": "Hosts the processor may send HTTP requests to; `[]` revokes every grant"}
                }},
                "CreatePipeline": {"type": "object", "required": ["processor", "key"], "properties": {
                    "processor": {"type": "string"},
                    "key": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
                    "name": {"type": "string"},
                    "time_mode": {"enum": ["none", "processing-time", "event-time"]},
                    "output_mode": {"enum": ["append", "update"]},
                    "partitions": {"type": "integer", "default": 4},
                    "event_time": {"type": "object", "properties": {"column": {"type": "string"}, "watermark_delay_ms": {"type": "integer"}}},
                    "output_event_time_column": {"type": "string"},
                    "trigger_interval_ms": {"type": "integer", "default": 1000},
                    "initial_state": {"type": "array", "items": {"type": "object"}}
                }},
            }
        }
    });
    kafka_document(&mut doc);
    doc
}

/// Adds the Kafka parts to the OpenAPI document: the grant endpoint, and the `source` and
/// `sink` of a pipeline.
fn kafka_document(doc: &mut Value) {
    let error = json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}});
    doc["paths"]["/v1/tenants/{id}/kafka"] = json!({
        "put": {
            "summary": "Grant a tenant's pipelines the Kafka brokers they may read and write, replacing the previous list (admin only; `[]` revokes every grant). A grant covers the cluster behind the address: librdkafka connects to every broker the cluster advertises. Running pipelines that use a broker no longer listed stop, marked failed",
            "security": [{"adminToken": []}],
            "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
            "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/KafkaGrant"}}}},
            "responses": {"200": {"description": "{brokers, stopped}: the grant and the pipelines it stopped"}, "400": {"description": "a broker that is not HOST:PORT"}, "default": error},
        },
        "get": {
            "summary": "The Kafka brokers granted to a tenant",
            "security": [{"adminToken": []}],
            "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "{tenant, brokers}"}, "default": error},
        },
    });
    let options = json!({"type": "object", "additionalProperties": {"type": "string"}, "description": format!("librdkafka settings; only {} (422 for any other; SASL mechanisms {})", crate::kafka::ALLOWED_OPTIONS.join(", "), crate::kafka::ALLOWED_SASL_MECHANISMS.join(", "))});
    let list = json!({"oneOf": [{"type": "string", "description": "comma-separated"}, {"type": "array", "items": {"type": "string"}}]});
    let schemas = &mut doc["components"]["schemas"];
    schemas["KafkaGrant"] = json!({"type": "object", "required": ["brokers"], "properties": {
        "brokers": {"type": "array", "items": {"type": "string", "description": "HOST:PORT"}},
    }});
    schemas["KafkaSource"] = json!({"type": "object", "required": ["brokers", "topics"], "properties": {
        "brokers": list, "topics": list,
        "starting_offsets": {"oneOf": [{"enum": ["earliest", "latest"]}, {"type": "object", "description": "{TOPIC: {PARTITION: OFFSET}}, -2 earliest, -1 latest"}], "default": "earliest"},
        "max_records_per_batch": {"type": "integer"},
        "columns": {"type": "array", "items": {"enum": ["key", "topic", "partition", "offset", "timestamp"]}},
        "partition_idle_timeout_ms": {"type": "integer", "default": statebox_kafka::DEFAULT_IDLE_TIMEOUT_MS},
        "options": options,
    }});
    schemas["KafkaSink"] = json!({"type": "object", "required": ["brokers", "topic"], "properties": {
        "brokers": list, "topic": {"type": "string"}, "key": list,
        "delivery": {"enum": ["exactly-once", "at-least-once"], "default": "exactly-once"},
        "options": options,
    }});
    let pipeline = &mut schemas["CreatePipeline"]["properties"];
    pipeline["source"] = json!({"oneOf": [{"const": "http"}, {"type": "object", "required": ["kafka"], "properties": {"kafka": {"$ref": "#/components/schemas/KafkaSource"}}}], "default": "http", "description": "HTTP ingest, or Kafka topics on brokers granted to the tenant (403 otherwise); a Kafka-source pipeline refuses ingest (409)"});
    pipeline["sink"] = json!({"oneOf": [{"const": "output"}, {"type": "object", "required": ["kafka"], "properties": {"kafka": {"$ref": "#/components/schemas/KafkaSink"}}}], "default": "output", "description": "the output log, or a Kafka topic (one transaction per batch); reading the output of a Kafka-sink pipeline answers 409"});
}
