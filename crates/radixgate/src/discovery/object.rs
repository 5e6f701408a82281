//! The object type the watch deserializes: a pod kept as raw JSON.
//!
//! Watching `Pod` itself would make one malformed object fail a whole list
//! (the watcher would then relist forever and see no pod at all) or a
//! watch event. [`RawPod`] accepts any JSON object: its metadata is read
//! as far as it can be (for the resource version the watch resumes from,
//! and the pod's name), and the body is parsed into a `Pod` later, per
//! object, where a failure is that object's alone (see `pod.rs`).

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::{Deserialize, Deserializer};
use serde_json::Value;
use std::borrow::Cow;

/// A pod object as the API server sent it.
#[derive(Clone, Debug, Default)]
pub(crate) struct RawPod {
    /// As much of `metadata` as could be read.
    pub(crate) metadata: ObjectMeta,
    /// The whole object.
    pub(crate) body: Value,
}

impl<'de> Deserialize<'de> for RawPod {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let body = Value::deserialize(deserializer)?;
        let raw = body.get("metadata").cloned().unwrap_or_default();
        let metadata = serde_json::from_value(raw.clone()).unwrap_or_else(|_| {
            // Malformed somewhere: keep the fields the watch and the log need.
            let text = |key: &str| raw.get(key).and_then(Value::as_str).map(str::to_owned);
            ObjectMeta {
                name: text("name"),
                namespace: text("namespace"),
                resource_version: text("resourceVersion"),
                uid: text("uid"),
                ..ObjectMeta::default()
            }
        });
        Ok(Self { metadata, body })
    }
}

impl Resource for RawPod {
    type DynamicType = ();
    type Scope = <Pod as Resource>::Scope;

    fn kind(dt: &()) -> Cow<'_, str> {
        Pod::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        Pod::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        Pod::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        Pod::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_object_is_accepted_and_its_metadata_read_as_far_as_it_goes() {
        let ok: RawPod = serde_json::from_value(json!({
            "metadata": {"name": "a", "namespace": "n", "resourceVersion": "3"},
            "spec": 5
        }))
        .unwrap();
        assert_eq!(ok.metadata.name.as_deref(), Some("a"));
        let bad: RawPod = serde_json::from_value(json!({
            "metadata": {"name": "b", "resourceVersion": "4", "labels": ["x"]}
        }))
        .unwrap();
        assert_eq!(bad.metadata.name.as_deref(), Some("b"));
        assert_eq!(bad.metadata.resource_version.as_deref(), Some("4"));
        let none: RawPod = serde_json::from_value(json!([1, 2])).unwrap();
        assert_eq!(none.metadata.name, None);
    }
}
