//! The task store (`statebox-cluster`) over a real S3 server on loopback (moto): a RocksDB
//! snapshot round trip (with an SST large enough to go up in parts), create-only owner
//! generations, plans and manifests refused over HTTP, an interrupted upload, damage to a
//! stored file found on restore, and a store without create-only writes refused at open.
//! The unit tests in `host/cluster` cover the same semantics on the in-memory and
//! local-directory backends.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use statebox_cluster::{Error, PlanPut, Retention, StateStore, TaskStore};
use statebox_tests::Rng;
use statebox_tests::s3::S3;

/// A moto server with bucket `state`, and the store `s3://state/<prefix>` on it.
fn s3_store(prefix: &str) -> (S3, StateStore) {
    let s3 = S3::start();
    s3.create_bucket("state");
    let url = format!("s3://state/{prefix}");
    let store = StateStore::open_with(&url, s3.env()).expect("open the store on moto");
    (s3, store)
}

fn open_db(dir: &Path) -> rocksdb::DB {
    let mut opts = rocksdb::Options::default();
    opts.create_if_missing(true);
    rocksdb::DB::open(&opts, dir).unwrap()
}

fn put_range(db: &rocksdb::DB, keys: std::ops::Range<u32>) {
    for i in keys {
        db.put(format!("key{i:06}"), format!("value{i}")).unwrap();
    }
    db.flush().unwrap();
}

fn checkpoint(db: &rocksdb::DB, scratch: &Path, name: &str) -> PathBuf {
    let dir = scratch.join(name);
    rocksdb::checkpoint::Checkpoint::new(db)
        .unwrap()
        .create_checkpoint(&dir)
        .unwrap();
    dir
}

fn read_back(dir: &Path, key: &str) -> Option<Vec<u8>> {
    rocksdb::DB::open_default(dir).unwrap().get(key).unwrap()
}

/// Overwrites `key` in bucket `state` with ten bytes, through a client of its own.
fn damage(s3: &S3, key: &str) {
    use object_store::ObjectStoreExt as _;
    let mut builder = object_store::aws::AmazonS3Builder::new().with_bucket_name("state");
    for (k, v) in s3.env() {
        builder = builder.with_config(k.to_ascii_lowercase().parse().unwrap(), v);
    }
    let client = builder.build().unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime
        .block_on(client.put(&key.into(), b"not an sst".to_vec().into()))
        .unwrap();
}

const NO_GRACE: Retention = Retention {
    keep: 3,
    grace: Duration::ZERO,
};

#[test]
fn a_rocksdb_snapshot_round_trips_through_s3() {
    let (_s3, store) = s3_store("query/a");
    let task = store.task("orders-0").unwrap();
    let g = task.claim().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let db = open_db(&scratch.path().join("db"));
    // 24 MiB of incompressible values in one flush: an SST over the single-PUT limit
    // (16 MiB), uploaded in parts.
    let mut rng = Rng::new(17);
    let big: Vec<(String, Vec<u8>)> = (0..6144)
        .map(|i| {
            let value: Vec<u8> = (0..512)
                .flat_map(|_| rng.next_u64().to_le_bytes())
                .collect();
            (format!("big{i:05}"), value)
        })
        .collect();
    for (k, v) in &big {
        db.put(k, v).unwrap();
    }
    db.flush().unwrap();
    put_range(&db, 0..1000);
    // Left in the WAL: the checkpoint's *.log file carries them.
    db.put("unflushed", "still here").unwrap();
    let cp = checkpoint(&db, scratch.path(), "cp");
    let manifest = task.upload_snapshot(g, 41, &cp, &NO_GRACE).unwrap();
    let largest = manifest.files.iter().map(|f| f.size).max().unwrap();
    assert!(largest > 16 << 20, "an SST of {largest} bytes");

    let latest = task.latest_snapshot().unwrap().expect("a snapshot");
    assert_eq!(latest, manifest);
    let restored = scratch.path().join("restored");
    task.restore(&latest, &restored).unwrap();
    assert_eq!(read_back(&restored, "key000999").unwrap(), b"value999");
    assert_eq!(read_back(&restored, "unflushed").unwrap(), b"still here");
    let db2 = rocksdb::DB::open_default(&restored).unwrap();
    for (k, v) in big.iter().step_by(97) {
        assert_eq!(db2.get(k).unwrap().as_deref(), Some(v.as_slice()), "{k}");
    }

    // Listed for `statebox group status`.
    let tasks = store.tasks().unwrap();
    assert_eq!(tasks.len(), 1);
    assert_eq!(
        (
            tasks[0].name.as_str(),
            tasks[0].owner_generation,
            tasks[0].snapshot_batch
        ),
        ("orders-0", Some(g), Some(41))
    );
}

#[test]
fn create_only_writes_are_refused_over_s3() {
    let (_s3, store) = s3_store("query/b");
    let task = store.task("orders-1").unwrap();

    // Owner generations: racing claimants each get their own.
    let claimed: BTreeSet<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let task = task.clone();
                s.spawn(move || task.claim().unwrap())
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(claimed, (1..=4).collect());
    let owner = 4;

    // Plans: the first write of batch N wins; later writers get its bytes.
    assert_eq!(task.put_plan(owner, 1, b"first").unwrap(), PlanPut::Written);
    assert_eq!(
        task.put_plan(owner, 1, b"second").unwrap(),
        PlanPut::Exists(b"first".to_vec())
    );
    assert_eq!(task.put_plan(owner, 2, b"two").unwrap(), PlanPut::Written);
    assert_eq!(
        task.plans_after(0).unwrap(),
        [(1, b"first".to_vec()), (2, b"two".to_vec())]
    );

    // Manifests: a second snapshot of one batch does not replace the first.
    let scratch = tempfile::tempdir().unwrap();
    let db = open_db(&scratch.path().join("db"));
    put_range(&db, 0..100);
    let first = task
        .upload_snapshot(owner, 2, &checkpoint(&db, scratch.path(), "a"), &NO_GRACE)
        .unwrap();
    put_range(&db, 100..200);
    let next = task.claim().unwrap();
    let again = task
        .upload_snapshot(next, 2, &checkpoint(&db, scratch.path(), "b"), &NO_GRACE)
        .unwrap();
    assert_eq!(again, first);

    // The fenced owner writes nothing more.
    let e = task.put_plan(owner, 3, b"late").unwrap_err();
    assert!(
        matches!(
            e,
            Error::Fenced {
                generation: 4,
                newest: Some(5),
                ..
            }
        ),
        "{e:?}"
    );
    assert_eq!(task.get_plan(3).unwrap(), None);
    let e = task
        .upload_snapshot(owner, 3, &checkpoint(&db, scratch.path(), "c"), &NO_GRACE)
        .unwrap_err();
    assert!(matches!(e, Error::Fenced { .. }), "{e:?}");
    assert_eq!(task.snapshot_batches().unwrap(), [2]);
}

#[test]
fn an_interrupted_upload_and_a_damaged_file_over_s3() {
    let (s3, store) = s3_store("query/c");
    let task: TaskStore = store.task("orders-2").unwrap();
    let g = task.claim().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let db = open_db(&scratch.path().join("db"));
    put_range(&db, 0..300);
    let kept = task
        .upload_snapshot(g, 10, &checkpoint(&db, scratch.path(), "cp10"), &NO_GRACE)
        .unwrap();

    // The next upload loses the task after its first file: the files are in S3, the
    // manifest is not, and snapshot 10 stays the latest.
    put_range(&db, 300..600);
    let cp11 = checkpoint(&db, scratch.path(), "cp11");
    let mut stored = 0;
    let e = task
        .upload_snapshot_observed(g, 11, &cp11, &NO_GRACE, |_, _| {
            stored += 1;
            if stored == 1 {
                store.task("orders-2").unwrap().claim().unwrap();
            }
        })
        .unwrap_err();
    assert!(matches!(e, Error::Fenced { .. }), "{e:?}");
    assert_eq!(stored, std::fs::read_dir(&cp11).unwrap().count());
    assert_eq!(task.snapshot(11).unwrap(), None);
    let latest = task.latest_snapshot().unwrap().unwrap();
    assert_eq!(latest, kept);
    let restored = scratch.path().join("restored");
    task.restore(&latest, &restored).unwrap();
    assert_eq!(read_back(&restored, "key000299").unwrap(), b"value299");
    assert_eq!(read_back(&restored, "key000300"), None);

    // Damage one SST in the bucket behind the store's back: the restore names it.
    let sst = latest
        .files
        .iter()
        .find(|f| f.name.ends_with(".sst"))
        .unwrap();
    damage(&s3, &format!("query/c/tasks/orders-2/{}", sst.key));
    let e = task
        .restore(&latest, &scratch.path().join("restored-again"))
        .unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Corrupt { .. }), "{e:?}");
    assert!(
        text.contains(&sst.name) && text.contains(&sst.key) && text.contains("10 bytes"),
        "{text}"
    );
}

#[test]
fn a_missing_bucket_is_an_error_naming_the_store() {
    let s3 = S3::start();
    let e = StateStore::open_with("s3://no-such-bucket/q", s3.env()).unwrap_err();
    let text = format!("{e}");
    assert!(matches!(e, Error::Store { .. }), "{e:?}");
    assert!(text.contains("s3://no-such-bucket/q"), "{text}");
}

#[test]
fn a_store_without_create_only_writes_is_refused_loudly() {
    // The same S3 server, with the client told not to send `If-None-Match: *` (what an
    // S3-compatible store without conditional writes amounts to): the fence would be
    // silently lost, so opening fails and says why.
    let s3 = S3::start();
    s3.create_bucket("state");
    let mut settings = s3.env();
    settings.push(("AWS_CONDITIONAL_PUT", "disabled".into()));
    let e = StateStore::open_with("s3://state/q", settings).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(
        text.contains("s3://state/q") && text.contains("does not honour create-only writes"),
        "{text}"
    );
}
