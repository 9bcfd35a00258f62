//! The task store on the in-memory and local-directory backends, with real RocksDB
//! checkpoints. `tests/all/cluster_store.rs` runs the same kinds of checks over S3.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use object_store::ObjectStoreExt as _;

use super::*;

/// An in-memory store and a local-directory store (the directory kept alive with it).
fn backends() -> Vec<(StateStore, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let local = StateStore::open(dir.path().join("store").to_str().unwrap()).unwrap();
    vec![
        (StateStore::open("memory://q").unwrap(), None),
        (local, Some(dir)),
    ]
}

/// A RocksDB database at `dir` holding `key<i>` = `value<i>` for `keys`, flushed to SSTs.
fn write_db(db: &rocksdb::DB, keys: std::ops::Range<u32>) {
    for i in keys {
        db.put(format!("key{i:05}"), format!("value{i}")).unwrap();
    }
    db.flush().unwrap();
}

fn open_db(dir: &Path) -> rocksdb::DB {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    rocksdb::DB::open(&opts, dir).unwrap()
}

/// A checkpoint of `db` in a fresh directory under `scratch`.
fn checkpoint(db: &rocksdb::DB, scratch: &Path, name: &str) -> std::path::PathBuf {
    let dir = scratch.join(name);
    rocksdb::checkpoint::Checkpoint::new(db)
        .unwrap()
        .create_checkpoint(&dir)
        .unwrap();
    dir
}

/// Every key in `db`, with its value, as text.
fn contents(dir: &Path) -> Vec<(String, String)> {
    let db = rocksdb::DB::open_default(dir).unwrap();
    db.iterator(rocksdb::IteratorMode::Start)
        .map(|kv| {
            let (k, v) = kv.unwrap();
            (
                String::from_utf8(k.to_vec()).unwrap(),
                String::from_utf8(v.to_vec()).unwrap(),
            )
        })
        .collect()
}

fn expected(keys: std::ops::Range<u32>) -> Vec<(String, String)> {
    keys.map(|i| (format!("key{i:05}"), format!("value{i}")))
        .collect()
}

/// Object keys under the task's `dir` (relative to the task).
fn objects(task: &TaskStore, dir: &str) -> BTreeSet<String> {
    task.shared
        .list(&task.path(dir))
        .unwrap()
        .iter()
        .map(|m| task.rel(&m.location).unwrap())
        .collect()
}

const NO_GRACE: Retention = Retention {
    keep: 3,
    grace: Duration::ZERO,
};

#[test]
fn bad_urls_and_names_are_refused_naming_them() {
    for url in [
        "",
        "http://x/y",
        "s3://",
        "s3:///prefix",
        "file://relative/dir",
    ] {
        let e = StateStore::open(url).unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Config(_)), "{url}: {e:?}");
        assert!(text.contains(&format!("{url:?}")), "{text}");
        assert!(text.contains("s3://BUCKET/PREFIX"), "{text}");
    }
    let e = StateStore::open_with("memory://", [("AWS_REGION", "x")]).unwrap_err();
    assert!(e.to_string().contains("s3:// URLs only"), "{e}");
    let store = StateStore::open("memory://").unwrap();
    for name in ["", "a/b", "..", "t p", "ü-1"] {
        let e = store.task(name).unwrap_err();
        assert!(e.to_string().contains(&format!("{name:?}")), "{e}");
    }
    store.task("orders.v2_x-17").unwrap();
}

#[test]
fn file_urls_and_plain_paths_name_the_same_directory() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/store");
    let a = StateStore::open(&format!("file://{}", path.display())).unwrap();
    assert!(path.is_dir(), "the directory is created");
    let g = a.task("t-0").unwrap().claim().unwrap();
    a.task("t-0").unwrap().put_plan(g, 1, b"p1").unwrap();
    let b = StateStore::open(path.to_str().unwrap()).unwrap();
    assert_eq!(b.task("t-0").unwrap().get_plan(1).unwrap().unwrap(), b"p1");
    assert!(path.join("tasks/t-0/plans/00000000000000000001").is_file());
    // The create-only probe leaves nothing behind.
    assert!(
        std::fs::read_dir(path.join(".statebox-probe")).map_or(true, |mut d| d.next().is_none())
    );
}

#[test]
fn owner_generations_are_create_only_and_fence_older_owners() {
    for (store, _dir) in backends() {
        let task = store.task("in-0").unwrap();
        assert_eq!(task.owner_generation().unwrap(), None);
        assert!(matches!(
            task.check_owner(1),
            Err(Error::Fenced { newest: None, .. })
        ));
        let old = task.claim().unwrap();
        assert_eq!(old, 1);
        task.check_owner(old).unwrap();
        assert_eq!(task.put_plan(old, 1, b"one").unwrap(), PlanPut::Written);

        let new = store.task("in-0").unwrap().claim().unwrap();
        assert_eq!(new, 2);
        let e = task.check_owner(old).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Fenced {
                    generation: 1,
                    newest: Some(2),
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(e.to_string().contains("generation 2 has claimed"), "{e}");
        // The fenced owner can neither plan nor snapshot nor prune.
        assert!(matches!(
            task.put_plan(old, 2, b"two"),
            Err(Error::Fenced { .. })
        ));
        assert_eq!(task.get_plan(2).unwrap(), None);
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        write_db(&db, 0..10);
        let cp = checkpoint(&db, scratch.path(), "cp");
        assert!(matches!(
            task.upload_snapshot(old, 1, &cp, &NO_GRACE),
            Err(Error::Fenced { .. })
        ));
        assert_eq!(task.latest_snapshot().unwrap(), None);
        assert!(matches!(
            task.delete_plans_before(old, 1),
            Err(Error::Fenced { .. })
        ));
        // A generation never claimed is not an owner either.
        assert!(matches!(
            task.check_owner(3),
            Err(Error::Fenced {
                newest: Some(2),
                ..
            })
        ));
        task.check_owner(new).unwrap();
    }
}

#[test]
fn concurrent_claims_get_distinct_generations() {
    for (store, _dir) in backends() {
        let task = store.task("race-0").unwrap();
        let claimed: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..6)
                .map(|_| {
                    let task = task.clone();
                    s.spawn(move || task.claim().unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let distinct: BTreeSet<u64> = claimed.iter().copied().collect();
        assert_eq!(distinct, (1..=6).collect(), "{claimed:?}");
        task.check_owner(6).unwrap();
    }
}

#[test]
fn plans_are_create_only_and_read_back_in_order() {
    for (store, _dir) in backends() {
        let task = store.task("in-1").unwrap();
        let first = task.claim().unwrap();
        assert_eq!(
            task.put_plan(first, 1, b"plan one").unwrap(),
            PlanPut::Written
        );
        // The same batch again, by the same owner or another: the stored plan wins.
        assert_eq!(
            task.put_plan(first, 1, b"another one").unwrap(),
            PlanPut::Exists(b"plan one".to_vec())
        );
        let second = task.claim().unwrap();
        assert_eq!(
            task.put_plan(second, 1, b"yet another").unwrap(),
            PlanPut::Exists(b"plan one".to_vec())
        );
        assert_eq!(task.get_plan(1).unwrap().unwrap(), b"plan one");
        for b in 2..=12 {
            assert_eq!(
                task.put_plan(second, b, format!("plan {b}").as_bytes())
                    .unwrap(),
                PlanPut::Written
            );
        }
        assert_eq!(task.get_plan(13).unwrap(), None);
        assert_eq!(task.latest_plan().unwrap(), Some(12));
        let after: Vec<u64> = task.plans_after(9).unwrap().iter().map(|p| p.0).collect();
        assert_eq!(after, [10, 11, 12], "numeric, not text, order past 9");
        assert_eq!(task.plans_after(0).unwrap().len(), 12);
        assert_eq!(task.plans_after(0).unwrap()[4], (5, b"plan 5".to_vec()));
        assert!(task.plans_after(12).unwrap().is_empty());

        // Retention may not delete plans past the newest snapshot.
        let e = task.delete_plans_before(second, 5).unwrap_err();
        assert!(matches!(e, Error::Config(_)), "{e:?}");
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        write_db(&db, 0..10);
        task.upload_snapshot(second, 6, &checkpoint(&db, scratch.path(), "cp"), &NO_GRACE)
            .unwrap();
        assert!(task.delete_plans_before(second, 8).is_err());
        assert_eq!(task.delete_plans_before(second, 7).unwrap(), 6);
        assert_eq!(task.get_plan(6).unwrap(), None);
        assert_eq!(task.plans_after(6).unwrap().len(), 6);
        // Re-running from before the retained log is refused, naming the missing plan.
        let e = task.plans_after(3).unwrap_err();
        assert!(
            e.to_string()
                .contains("plan 4 is missing but plan 7 exists"),
            "{e}"
        );
    }
}

#[test]
fn a_rocksdb_checkpoint_round_trips_through_the_store() {
    for (store, _dir) in backends() {
        let task = store.task("in-2").unwrap();
        let g = task.claim().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        write_db(&db, 0..500);
        // Unflushed writes live in the WAL, which the checkpoint copies as a *.log file.
        for i in 500..600 {
            db.put(format!("key{i:05}"), format!("value{i}")).unwrap();
        }
        let cp = checkpoint(&db, scratch.path(), "cp");
        let manifest = task.upload_snapshot(g, 7, &cp, &NO_GRACE).unwrap();
        assert_eq!((manifest.batch, manifest.generation), (7, g));
        let names: Vec<&str> = manifest.files.iter().map(|f| f.name.as_str()).collect();
        assert!(names.iter().any(|n| n.ends_with(".sst")), "{names:?}");
        assert!(names.contains(&"CURRENT"), "{names:?}");
        assert!(
            names.iter().any(|n| n.starts_with("MANIFEST-")),
            "{names:?}"
        );

        let latest = task.latest_snapshot().unwrap().unwrap();
        assert_eq!(latest, manifest);
        let restored = scratch.path().join("restored");
        task.restore(&latest, &restored).unwrap();
        assert_eq!(contents(&restored), expected(0..600));
        // Restoring needs a fresh directory.
        let e = task.restore(&latest, &restored).unwrap_err();
        assert!(e.to_string().contains("not empty"), "{e}");
    }
}

#[test]
fn ssts_are_uploaded_once_across_snapshots() {
    for (store, _dir) in backends() {
        let task = store.task("in-3").unwrap();
        let g = task.claim().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        write_db(&db, 0..100);
        write_db(&db, 100..200);
        let mut first = Vec::new();
        let cp1 = checkpoint(&db, scratch.path(), "cp1");
        task.upload_snapshot_observed(g, 1, &cp1, &NO_GRACE, |f, up| {
            first.push((f.name.clone(), up));
        })
        .unwrap();
        let first_ssts: BTreeSet<String> = first
            .iter()
            .filter(|(n, _)| n.ends_with(".sst"))
            .map(|(n, up)| {
                assert!(up, "{n} is new, so uploaded");
                n.clone()
            })
            .collect();
        assert_eq!(first_ssts.len(), 2, "{first:?}");

        write_db(&db, 200..300);
        let mut second = Vec::new();
        let cp2 = checkpoint(&db, scratch.path(), "cp2");
        let m2 = task
            .upload_snapshot_observed(g, 2, &cp2, &NO_GRACE, |f, up| {
                second.push((f.name.clone(), up));
            })
            .unwrap();
        for (name, uploaded) in &second {
            let old_sst = first_ssts.contains(name);
            // SSTs already stored are skipped; everything else is this snapshot's own.
            assert_eq!(*uploaded, !old_sst, "{name}: {second:?}");
        }
        assert_eq!(
            second.iter().filter(|(n, _)| n.ends_with(".sst")).count(),
            3
        );
        // One object per distinct SST, shared by both manifests.
        assert_eq!(objects(&task, "files").len(), 3);
        let restored = scratch.path().join("restored");
        task.restore(&m2, &restored).unwrap();
        assert_eq!(contents(&restored), expected(0..300));
    }
}

#[test]
fn an_upload_stopped_before_its_manifest_leaves_the_previous_snapshot() {
    for (store, _dir) in backends() {
        let task = store.task("in-4").unwrap();
        let g = task.claim().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        write_db(&db, 0..50);
        task.upload_snapshot(g, 3, &checkpoint(&db, scratch.path(), "cp3"), &NO_GRACE)
            .unwrap();
        write_db(&db, 50..80);
        db.delete("key00000").unwrap();
        db.flush().unwrap();
        let cp4 = checkpoint(&db, scratch.path(), "cp4");
        // Another worker takes the task while the upload is under way: files go up, but
        // the manifest never does.
        let mut stored = 0;
        let e = task
            .upload_snapshot_observed(g, 4, &cp4, &NO_GRACE, |_, _| {
                stored += 1;
                if stored == 1 {
                    store.task("in-4").unwrap().claim().unwrap();
                }
            })
            .unwrap_err();
        assert!(matches!(e, Error::Fenced { .. }), "{e:?}");
        assert_eq!(
            stored,
            std::fs::read_dir(&cp4).unwrap().count(),
            "every file went up"
        );
        assert!(
            objects(&task, "snapshots")
                .iter()
                .any(|k| k.starts_with("snapshots/00000000000000000004/"))
        );
        assert_eq!(task.snapshot(4).unwrap(), None);
        assert_eq!(task.snapshot_batches().unwrap(), [3]);
        let latest = task.latest_snapshot().unwrap().unwrap();
        assert_eq!(latest.batch, 3);
        let restored = scratch.path().join("restored");
        task.restore(&latest, &restored).unwrap();
        assert_eq!(contents(&restored), expected(0..50));
    }
}

#[test]
fn a_snapshot_once_written_is_not_replaced() {
    for (store, _dir) in backends() {
        let task = store.task("in-5").unwrap();
        let old = task.claim().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        write_db(&db, 0..20);
        let first = task
            .upload_snapshot(old, 5, &checkpoint(&db, scratch.path(), "a"), &NO_GRACE)
            .unwrap();
        write_db(&db, 20..40);
        let new = task.claim().unwrap();
        let again = task
            .upload_snapshot(new, 5, &checkpoint(&db, scratch.path(), "b"), &NO_GRACE)
            .unwrap();
        assert_eq!(again, first, "the stored manifest is kept and returned");
        assert_eq!(task.latest_snapshot().unwrap().unwrap().generation, old);
    }
}

#[test]
fn a_damaged_or_missing_file_fails_the_restore_naming_it() {
    for (store, _dir) in backends() {
        let task = store.task("in-6").unwrap();
        let g = task.claim().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        write_db(&db, 0..100);
        let manifest = task
            .upload_snapshot(g, 1, &checkpoint(&db, scratch.path(), "cp"), &NO_GRACE)
            .unwrap();
        let sst = manifest
            .files
            .iter()
            .find(|f| f.name.ends_with(".sst"))
            .unwrap();
        let current = manifest.files.iter().find(|f| f.name == "CURRENT").unwrap();

        // Same size, one byte changed: only the hash can tell.
        let path = task.path(&sst.key);
        let shared = &task.shared;
        let mut bytes = shared
            .block_on(async { shared.store.get(&path).await.unwrap().bytes().await })
            .unwrap()
            .to_vec();
        bytes[10] ^= 0xff;
        shared
            .block_on(shared.store.put(&path, bytes.into()))
            .unwrap();
        let e = task
            .restore(&manifest, &scratch.path().join("r1"))
            .unwrap_err();
        let text = e.to_string();
        assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
        assert!(
            text.contains(&sst.name) && text.contains(&sst.key),
            "{text}"
        );
        assert!(text.contains("BLAKE3"), "{text}");

        shared
            .block_on(shared.store.delete(&task.path(&current.key)))
            .unwrap();
        let only_current = Manifest {
            files: vec![current.clone()],
            ..manifest.clone()
        };
        let e = task
            .restore(&only_current, &scratch.path().join("r2"))
            .unwrap_err();
        assert!(
            e.to_string().contains("CURRENT") && e.to_string().contains("missing"),
            "{e}"
        );
    }
}

#[test]
fn retention_keeps_the_newest_snapshots_and_their_files() {
    for (store, _dir) in backends() {
        let task = store.task("in-7").unwrap();
        let g = task.claim().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        let keep_one = Retention {
            keep: 1,
            grace: Duration::ZERO,
        };
        let mut manifests = Vec::new();
        for batch in 1..=3u32 {
            write_db(&db, (batch - 1) * 100..batch * 100);
            // Compaction rewrites the SSTs, so older snapshots' SSTs become unreferenced.
            db.compact_range(None::<&[u8]>, None::<&[u8]>);
            let cp = checkpoint(&db, scratch.path(), &format!("cp{batch}"));
            manifests.push(
                task.upload_snapshot(g, batch.into(), &cp, &keep_one)
                    .unwrap(),
            );
        }
        assert_eq!(task.snapshot_batches().unwrap(), [3]);
        let last = &manifests[2];
        let referenced: BTreeSet<String> = last.files.iter().map(|f| f.key.clone()).collect();
        let stored: BTreeSet<String> = objects(&task, "files")
            .into_iter()
            .chain(objects(&task, "snapshots"))
            .filter(|k| !k.ends_with(".json"))
            .collect();
        assert_eq!(stored, referenced);
        let restored = scratch.path().join("restored");
        task.restore(last, &restored).unwrap();
        assert_eq!(contents(&restored), expected(0..300));

        // With a grace period, fresh unreferenced files survive (an upload in progress).
        write_db(&db, 300..400);
        db.compact_range(None::<&[u8]>, None::<&[u8]>);
        let cp = checkpoint(&db, scratch.path(), "cp4");
        task.upload_snapshot(
            g,
            4,
            &cp,
            &Retention {
                keep: 1,
                grace: Duration::from_secs(3600),
            },
        )
        .unwrap();
        assert_eq!(task.snapshot_batches().unwrap(), [4]);
        assert!(
            objects(&task, "files").len() > 1,
            "batch 3's SST is kept during the grace"
        );
        assert!(
            task.upload_snapshot(
                g,
                5,
                &cp,
                &Retention {
                    keep: 0,
                    grace: Duration::ZERO
                }
            )
            .is_err()
        );
    }
}

#[test]
fn tasks_lists_each_task_with_its_newest_state() {
    for (store, _dir) in backends() {
        assert!(store.tasks().unwrap().is_empty());
        let a = store.task("t-0").unwrap();
        let b = store.task("t-1").unwrap();
        let ga = a.claim().unwrap();
        a.claim().unwrap();
        let gb = b.claim().unwrap();
        b.put_plan(gb, 1, b"x").unwrap();
        b.put_plan(gb, 2, b"y").unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let db = open_db(&scratch.path().join("db"));
        write_db(&db, 0..10);
        b.upload_snapshot(gb, 2, &checkpoint(&db, scratch.path(), "cp"), &NO_GRACE)
            .unwrap();
        let tasks = store.tasks().unwrap();
        assert_eq!(tasks.len(), 2, "{tasks:?}");
        assert_eq!(
            (
                tasks[0].name.as_str(),
                tasks[0].owner_generation,
                tasks[0].latest_plan,
                tasks[0].snapshot_batch
            ),
            ("t-0", Some(ga + 1), None, None)
        );
        assert_eq!(
            (
                tasks[1].name.as_str(),
                tasks[1].owner_generation,
                tasks[1].latest_plan,
                tasks[1].snapshot_batch
            ),
            ("t-1", Some(gb), Some(2), Some(2))
        );
        let at = tasks[1].snapshot_at_ms.unwrap();
        let now = i64::try_from(task::now_ms()).unwrap();
        assert!(
            (now - 600_000..=now + 600_000).contains(&at),
            "{at} vs {now}"
        );
    }
}

#[test]
fn a_read_only_store_reads_and_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let e = StateStore::open_read_only(path.to_str().unwrap()).unwrap_err();
    assert!(e.to_string().contains("no directory"), "{e}");
    assert!(!path.exists(), "reading creates nothing");

    let writer = StateStore::open(path.to_str().unwrap())
        .unwrap()
        .task("t-0")
        .unwrap();
    let g = writer.claim().unwrap();
    writer.put_plan(g, 1, b"p").unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let db = open_db(&scratch.path().join("db"));
    write_db(&db, 0..10);
    let cp = checkpoint(&db, scratch.path(), "cp");
    writer.upload_snapshot(g, 1, &cp, &NO_GRACE).unwrap();

    let reader = StateStore::open_read_only(path.to_str().unwrap()).unwrap();
    assert_eq!(reader.tasks().unwrap()[0].snapshot_batch, Some(1));
    let task = reader.task("t-0").unwrap();
    assert_eq!(task.get_plan(1).unwrap().unwrap(), b"p");
    let manifest = task.latest_snapshot().unwrap().unwrap();
    task.restore(&manifest, &scratch.path().join("restored"))
        .unwrap();
    assert_eq!(contents(&scratch.path().join("restored")), expected(0..10));
    for e in [
        task.claim().unwrap_err(),
        task.put_plan(g, 2, b"q").unwrap_err(),
        task.upload_snapshot(g, 2, &cp, &NO_GRACE).unwrap_err(),
        task.delete_plans_before(g, 1).unwrap_err(),
    ] {
        assert!(e.to_string().contains("read-only"), "{e}");
    }
    assert_eq!(writer.owner_generation().unwrap(), Some(g));
    assert_eq!(writer.latest_plan().unwrap(), Some(1));
}
