//! Workers' member records: `PREFIX/members/<member>.json`, each written by its worker when
//! its assignment changes and every few seconds while it runs. The Kafka group coordinator
//! is the authority on who owns what; these records are what `statebox group status` can
//! show on any broker (some Kafka-protocol brokers answer DescribeGroups without members),
//! with their age telling a live worker from a gone one.

use futures::TryStreamExt as _;
use object_store::path::Path;
use object_store::{ObjectStoreExt as _, PutPayload};

use crate::error::Result;
use crate::keys;
use crate::store::StateStore;

/// One worker's record, as stored.
#[derive(Clone, Debug)]
pub struct MemberRecord {
    /// The member's name (`--member`).
    pub name: String,
    /// The JSON the worker wrote.
    pub body: serde_json::Value,
    /// When it was written (the store's clock), in milliseconds since the Unix epoch.
    pub written_at_ms: i64,
}

impl StateStore {
    fn member_path(&self, name: &str) -> Path {
        self.shared
            .root
            .clone()
            .join(keys::MEMBERS)
            .join(format!("{name}.json"))
    }

    /// Writes (replaces) member `name`'s record. `name` follows the task name rules.
    pub fn put_member(&self, name: &str, body: &serde_json::Value) -> Result<()> {
        keys::check_task_name(name)?;
        let shared = &self.shared;
        shared.check_writable("write a member record")?;
        let path = self.member_path(name);
        let bytes = serde_json::to_vec(body).expect("JSON serialises");
        shared
            .block_on(shared.store.put(&path, PutPayload::from(bytes)))
            .map_err(|e| shared.err(format!("write {path}"), e))?;
        Ok(())
    }

    /// Every member record, by name.
    pub fn members(&self) -> Result<Vec<MemberRecord>> {
        let shared = &self.shared;
        let dir = shared.root.clone().join(keys::MEMBERS);
        let metas: Vec<object_store::ObjectMeta> = shared
            .block_on(shared.store.list(Some(&dir)).try_collect())
            .map_err(|e| shared.err(format!("list {dir}/"), e))?;
        let mut out = Vec::with_capacity(metas.len());
        for meta in metas {
            let Some(name) = meta
                .location
                .filename()
                .and_then(|f| f.strip_suffix(".json"))
                .map(str::to_owned)
            else {
                continue;
            };
            let read =
                shared.block_on(async { shared.store.get(&meta.location).await?.bytes().await });
            let bytes = match read {
                Ok(b) => b,
                // Removed between the listing and the read.
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(shared.err(format!("read {}", meta.location), e)),
            };
            let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
            out.push(MemberRecord {
                name,
                body,
                written_at_ms: meta.last_modified.timestamp_millis(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn member_records_are_replaced_and_listed_by_name() {
        let store = StateStore::open("memory://q").unwrap();
        store
            .put_member("w2", &serde_json::json!({"owned": [1]}))
            .unwrap();
        store
            .put_member("w1", &serde_json::json!({"owned": [0]}))
            .unwrap();
        store
            .put_member("w1", &serde_json::json!({"owned": [0, 2]}))
            .unwrap();
        let members = store.members().unwrap();
        let names: Vec<&str> = members.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["w1", "w2"]);
        assert_eq!(members[0].body["owned"], serde_json::json!([0, 2]));
        assert!(store.put_member("../x", &serde_json::json!({})).is_err());
        // Tasks are not confused with members.
        assert!(store.tasks().unwrap().is_empty());
    }
}
