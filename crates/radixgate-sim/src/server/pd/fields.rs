//! Reading a request's PD part from its body: the SGLang bootstrap fields
//! (scalars, or arrays of a `/generate` batch's length) or vLLM's
//! `kv_transfer_params`, and what this worker's role makes of them.
//!
//! A regular worker ignores both (as engines without disaggregation do).
//! A prefill worker acts on the bootstrap fields and on
//! `do_remote_decode: true`; a decode worker on the bootstrap fields and on
//! `do_remote_prefill: true`. A vLLM step sent to the wrong role is a 400
//! naming the field, since a router that does it has a bug worth seeing.

use serde::Deserialize;
use serde_json::Value;

use super::pull::Source;
use super::{PdConfig, Role};
use crate::error::SimError;
use crate::server::request::Api;

/// The part one request (or batch item) plays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Part {
    /// No PD fields for this role: served as a regular worker serves it.
    Regular,
    /// Compute the prompt and hold its KV under this room (SGLang).
    PrefillRoom(String),
    /// Compute the prompt, hold its KV under a fresh id and answer
    /// `kv_transfer_params` (vLLM step one).
    PrefillVllm,
    /// Pull the prompt's KV from a prefill worker, then decode.
    Decode(Source),
}

#[derive(Deserialize)]
struct PdFields {
    #[serde(default)]
    bootstrap_host: Value,
    #[serde(default)]
    bootstrap_port: Value,
    #[serde(default)]
    bootstrap_room: Value,
    #[serde(default)]
    kv_transfer_params: Value,
}

fn bad(message: String, param: &str) -> SimError {
    SimError::bad_request(message, Some(param))
}

/// `v` as `n` values: an array of length `n`, or a scalar (repeated; a
/// room only when `n` is 1, since rooms must differ).
fn spread(v: Value, n: usize, name: &str) -> Result<Vec<Value>, SimError> {
    match v {
        Value::Array(items) if items.len() == n => Ok(items),
        Value::Array(items) => Err(bad(
            format!(
                "{name} has {} entries but the batch has {n} prompts",
                items.len()
            ),
            name,
        )),
        v if n == 1 || name != "bootstrap_room" => Ok(vec![v; n]),
        _ => Err(bad(
            format!("{name} must be a list of {n} rooms for a batch of {n}"),
            name,
        )),
    }
}

/// The part each of a request's `items` prompts plays on a worker with
/// settings `pd`.
pub(crate) fn plan(
    pd: &PdConfig,
    api: Api,
    body: &[u8],
    items: usize,
) -> Result<Vec<Part>, SimError> {
    let regular = || vec![Part::Regular; items];
    if pd.role == Role::Regular || !matches!(api, Api::Chat | Api::Completions | Api::Generate) {
        return Ok(regular());
    }
    // The body already parsed as this API's request; only these fields.
    let f: PdFields = serde_json::from_slice(body).map_err(crate::server::request::bad)?;
    if !f.bootstrap_room.is_null() {
        return bootstrap(pd, f, items);
    }
    match f.kv_transfer_params {
        Value::Null => Ok(regular()),
        Value::Object(p) => {
            let flag = |k: &str| p.get(k).and_then(Value::as_bool).unwrap_or(false);
            match (flag("do_remote_decode"), flag("do_remote_prefill"), pd.role) {
                (true, _, Role::Prefill) => Ok(vec![Part::PrefillVllm]),
                (true, _, _) => Err(bad(
                    "kv_transfer_params.do_remote_decode is a prefill step, and this is a decode worker"
                        .into(),
                    "kv_transfer_params",
                )),
                (false, true, Role::Decode) => Ok(vec![Part::Decode(vllm_source(&p)?)]),
                (false, true, _) => Err(bad(
                    "kv_transfer_params.do_remote_prefill is a decode step, and this is a prefill worker"
                        .into(),
                    "kv_transfer_params",
                )),
                (false, false, _) => Ok(regular()),
            }
        }
        _ => Err(bad(
            "kv_transfer_params must be an object".into(),
            "kv_transfer_params",
        )),
    }
}

fn bootstrap(pd: &PdConfig, f: PdFields, n: usize) -> Result<Vec<Part>, SimError> {
    let rooms = spread(f.bootstrap_room, n, "bootstrap_room")?;
    let rooms = rooms
        .into_iter()
        .map(|r| {
            r.as_u64().map(|r| r.to_string()).ok_or_else(|| {
                bad(
                    format!("bootstrap_room must be a non-negative integer, got {r}"),
                    "bootstrap_room",
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if pd.role == Role::Prefill {
        return Ok(rooms.into_iter().map(Part::PrefillRoom).collect());
    }
    let hosts = spread(f.bootstrap_host, n, "bootstrap_host")?;
    let ports = spread(f.bootstrap_port, n, "bootstrap_port")?;
    rooms
        .into_iter()
        .zip(hosts)
        .zip(ports)
        .map(|((room, host), port)| {
            let host = match host {
                Value::String(h) if !h.is_empty() => h,
                other => {
                    return Err(bad(
                        format!("bootstrap_host must be the prefill worker's host, got {other}"),
                        "bootstrap_host",
                    ));
                }
            };
            let port = match port {
                Value::Null => pd.default_bootstrap_port.ok_or_else(|| {
                    bad(
                        format!(
                            "bootstrap_port is null for room {room}, and this decode worker has no \
                             default (--default-bootstrap-port)"
                        ),
                        "bootstrap_port",
                    )
                })?,
                p => port_of(&p).ok_or_else(|| {
                    bad(
                        format!("bootstrap_port must be a port number or null, got {p}"),
                        "bootstrap_port",
                    )
                })?,
            };
            Ok(Part::Decode(Source {
                host,
                port,
                key: room,
            }))
        })
        .collect()
}

fn port_of(v: &Value) -> Option<u16> {
    v.as_u64()
        .and_then(|p| u16::try_from(p).ok())
        .filter(|&p| p != 0)
}

fn vllm_source(p: &serde_json::Map<String, Value>) -> Result<Source, SimError> {
    let field = |k: &str| format!("kv_transfer_params.{k}");
    let host = p
        .get("remote_host")
        .and_then(Value::as_str)
        .filter(|h| !h.is_empty())
        .ok_or_else(|| {
            bad(
                format!("{} must be the prefill worker's host", field("remote_host")),
                "kv_transfer_params",
            )
        })?;
    let port = p.get("remote_port").and_then(port_of).ok_or_else(|| {
        bad(
            format!("{} must be a port number", field("remote_port")),
            "kv_transfer_params",
        )
    })?;
    let key = p
        .get("remote_request_id")
        .and_then(Value::as_str)
        .filter(|k| !k.is_empty())
        .ok_or_else(|| {
            bad(
                format!(
                    "{} must name the prefill's request",
                    field("remote_request_id")
                ),
                "kv_transfer_params",
            )
        })?;
    Ok(Source {
        host: host.to_owned(),
        port,
        key: key.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(role: Role) -> PdConfig {
        PdConfig {
            role,
            ..PdConfig::default()
        }
    }

    fn plan_of(pd: &PdConfig, api: Api, body: Value, n: usize) -> Result<Vec<Part>, SimError> {
        plan(pd, api, body.to_string().as_bytes(), n)
    }

    fn src(port: u16, key: &str) -> Part {
        Part::Decode(Source {
            host: "127.0.0.1".into(),
            port,
            key: key.into(),
        })
    }

    #[test]
    fn bootstrap_fields_by_role() {
        let body = serde_json::json!({"text": "x", "bootstrap_host": "127.0.0.1",
            "bootstrap_port": 8998, "bootstrap_room": 42});
        let p = plan_of(&role(Role::Prefill), Api::Generate, body.clone(), 1).unwrap();
        assert_eq!(p, vec![Part::PrefillRoom("42".into())]);
        let d = plan_of(&role(Role::Decode), Api::Generate, body.clone(), 1).unwrap();
        assert_eq!(d, vec![src(8998, "42")]);
        let r = plan_of(&role(Role::Regular), Api::Generate, body, 1).unwrap();
        assert_eq!(r, vec![Part::Regular]);
        let none = serde_json::json!({"text": "x"});
        assert_eq!(
            plan_of(&role(Role::Decode), Api::Generate, none, 1).unwrap(),
            vec![Part::Regular]
        );
    }

    #[test]
    fn batches_take_arrays_and_null_ports_need_a_default() {
        let body = serde_json::json!({"text": ["a", "b"], "bootstrap_host": ["127.0.0.1", "127.0.0.1"],
            "bootstrap_port": [null, null], "bootstrap_room": [7, 8]});
        let e = plan_of(&role(Role::Decode), Api::Generate, body.clone(), 2).unwrap_err();
        assert!(e.to_string().contains("--default-bootstrap-port"), "{e}");
        let pd = PdConfig {
            default_bootstrap_port: Some(9000),
            ..role(Role::Decode)
        };
        let d = plan_of(&pd, Api::Generate, body.clone(), 2).unwrap();
        assert_eq!(d, vec![src(9000, "7"), src(9000, "8")]);
        let e = plan_of(&pd, Api::Generate, body, 3)
            .unwrap_err()
            .to_string();
        assert!(e.contains("has 2 entries but the batch has 3"), "{e}");
        let one_room = serde_json::json!({"text": ["a", "b"], "bootstrap_host": "h",
            "bootstrap_port": 1, "bootstrap_room": 7});
        assert!(plan_of(&pd, Api::Generate, one_room, 2).is_err());
        let neg = serde_json::json!({"text": "a", "bootstrap_host": "h", "bootstrap_port": 1,
            "bootstrap_room": -1});
        assert!(plan_of(&pd, Api::Generate, neg, 1).is_err());
    }

    #[test]
    fn vllm_steps_by_role() {
        let step1 = serde_json::json!({"prompt": "x", "kv_transfer_params": {"do_remote_decode": true,
            "do_remote_prefill": false, "remote_engine_id": null, "remote_block_ids": null,
            "remote_host": null, "remote_port": null}});
        assert_eq!(
            plan_of(&role(Role::Prefill), Api::Completions, step1.clone(), 1).unwrap(),
            vec![Part::PrefillVllm]
        );
        let e = plan_of(&role(Role::Decode), Api::Completions, step1.clone(), 1).unwrap_err();
        assert!(e.to_string().contains("prefill step"), "{e}");
        assert_eq!(
            plan_of(&role(Role::Regular), Api::Completions, step1, 1).unwrap(),
            vec![Part::Regular]
        );
        let step2 = serde_json::json!({"prompt": "x", "kv_transfer_params": {"do_remote_decode": false,
            "do_remote_prefill": true, "remote_engine_id": "p", "remote_block_ids": [0],
            "remote_host": "127.0.0.1", "remote_port": 5, "remote_request_id": "cmpl-p-1", "tp_size": 1}});
        assert_eq!(
            plan_of(&role(Role::Decode), Api::Completions, step2.clone(), 1).unwrap(),
            vec![src(5, "cmpl-p-1")]
        );
        assert!(plan_of(&role(Role::Prefill), Api::Completions, step2, 1).is_err());
        let no_port = serde_json::json!({"prompt": "x", "kv_transfer_params": {"do_remote_prefill": true,
            "remote_host": "127.0.0.1", "remote_request_id": "r"}});
        let e = plan_of(&role(Role::Decode), Api::Completions, no_port, 1).unwrap_err();
        assert!(e.to_string().contains("remote_port"), "{e}");
    }
}
