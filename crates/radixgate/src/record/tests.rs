//! The recorder and its writer on real files: lines, rotation, the queue's
//! bound, switching, and admin paths.

use super::*;
use crate::usage::{Counts, Usage};
use radixgate_routing::{PolicyConfig, Registry};

fn dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("radixgate-record-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn recorder(config: &RecordTraceConfig) -> Recorder {
    let registry = Registry::new(PolicyConfig::default().build().unwrap());
    Recorder::new(config, registry.router(), &Metrics::new()).unwrap()
}

fn end(text: &str) -> Ended<'static> {
    Ended {
        text: text.to_owned(),
        model: Some("m"),
        worker: "http://w:1",
        status: 200,
        started: Instant::now(),
        usage: Some(Usage {
            counts: Counts {
                prompt: Some(600),
                completion: Some(3),
            },
            cached: crate::usage::CachedReport::Absent,
        }),
    }
}

fn lines(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn requests_become_lines_and_stop_waits_for_them() {
    let d = dir("lines");
    let path = d.join("t.jsonl");
    let r = recorder(&RecordTraceConfig {
        path: Some(path.clone()),
        ..RecordTraceConfig::default()
    });
    assert!(r.status().recording);
    for i in 0..50 {
        let p = r.pending("cache_hit", false).expect("recording");
        r.record(p, end(&format!("prompt {i}")));
    }
    let status = r.stop();
    assert!(!status.recording);
    assert_eq!(status.lines, 50, "{status:?}");
    let got = lines(&path);
    assert_eq!(got.len(), 50);
    assert_eq!(got[0]["input_length"], 600);
    assert_eq!(got[0]["hash_ids"].as_array().unwrap().len(), 2);
    assert_eq!(got[0]["worker"], "http://w:1");
    assert!(got[0]["cached_tokens"].is_null());
    // Off: nothing is kept, nothing written.
    assert!(r.pending("cache_hit", false).is_none());
    assert_eq!(r.status(), Status::off());
    // A new recording appends to the file.
    r.start(Settings {
        path: path.clone(),
        max_bytes: 0,
        keep: 1,
    })
    .unwrap();
    let p = r.pending("imbalanced", true).unwrap();
    r.record(p, end("again"));
    assert_eq!(r.stop().lines, 1);
    assert_eq!(lines(&path).len(), 51);
    assert_eq!(lines(&path)[50]["branch"], "imbalanced");
    let _ = std::fs::remove_dir_all(&d);
}

/// A recording that ended in the middle of a line (the disk filled, or
/// the process was killed during a write) leaves a torn last line; the
/// next recording to the file must not glue its first line onto it, and
/// the file must stay one that `simulate` and `tune` load.
#[test]
fn a_recording_after_a_torn_last_line_leaves_only_whole_lines() {
    let d = dir("torn");
    let path = d.join("t.jsonl");
    let settings = Settings {
        path: path.clone(),
        max_bytes: 0,
        keep: 1,
    };
    let r = recorder(&RecordTraceConfig::default());
    let record = |n: usize| {
        r.start(settings.clone()).unwrap();
        for i in 0..n {
            let p = r.pending("cache_hit", false).unwrap();
            r.record(p, end(&format!("prompt {i}")));
        }
        assert_eq!(r.stop().lines, n as u64);
    };
    record(3);
    let whole = std::fs::read(&path).unwrap();
    let first_line = whole.split(|&b| b == b'\n').next().unwrap().to_vec();
    // Half a line, as a write cut short leaves it.
    let mut torn = whole.clone();
    torn.extend_from_slice(&first_line[..first_line.len() / 2]);
    std::fs::write(&path, &torn).unwrap();
    record(2);
    assert_eq!(lines(&path).len(), 5, "the torn line is cut");
    assert!(radixgate_sim::workload::load_trace(&path, 512).is_ok());
    // A whole line only missing its newline is kept, and ended.
    let mut unended = whole.clone();
    unended.extend_from_slice(&first_line);
    std::fs::write(&path, &unended).unwrap();
    record(1);
    assert_eq!(lines(&path).len(), 5, "the unended line is kept");
    // A file that is one torn line is emptied.
    std::fs::write(&path, &first_line[..10]).unwrap();
    record(1);
    assert_eq!(lines(&path).len(), 1);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn files_rotate_by_size_and_keep_that_many() {
    let d = dir("rotate");
    let path = d.join("t.jsonl");
    let r = recorder(&RecordTraceConfig::default());
    r.start(Settings {
        path: path.clone(),
        max_bytes: 1000,
        keep: 2,
    })
    .unwrap();
    for i in 0..40 {
        let p = r.pending("cache_hit", false).unwrap();
        r.record(p, end(&format!("p{i}")));
    }
    let status = r.stop();
    assert_eq!(status.lines, 40);
    assert!(status.rotations >= 3, "{status:?}");
    let sizes: Vec<u64> = [
        path.clone(),
        writer::rotated(&path, 1),
        writer::rotated(&path, 2),
    ]
    .iter()
    .map(|p| std::fs::metadata(p).unwrap().len())
    .collect();
    assert!(sizes.iter().all(|&s| s > 0 && s <= 1000), "{sizes:?}");
    assert!(!writer::rotated(&path, 3).exists(), "keep 2");
    // The newest lines are in FILE, the ones before in FILE.1.
    let newest = lines(&path);
    let before = lines(&writer::rotated(&path, 1));
    let stamp = |v: &serde_json::Value| v["timestamp"].as_u64().unwrap();
    assert!(stamp(before.last().unwrap()) <= stamp(&newest[0]));
    // keep 0: a full file is deleted.
    let path0 = d.join("zero.jsonl");
    r.start(Settings {
        path: path0.clone(),
        max_bytes: 1000,
        keep: 0,
    })
    .unwrap();
    for i in 0..40 {
        let p = r.pending("cache_hit", false).unwrap();
        r.record(p, end(&format!("p{i}")));
    }
    let status = r.stop();
    assert!(status.rotations >= 3);
    assert!(!writer::rotated(&path0, 1).exists());
    assert!(lines(&path0).len() < 40);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_full_queue_drops_and_counts_without_waiting() {
    let d = dir("full");
    let path = d.join("t.jsonl");
    let r = recorder(&RecordTraceConfig::default());
    r.start(Settings {
        path: path.clone(),
        max_bytes: 0,
        keep: 0,
    })
    .unwrap();
    // Prompts bigger than the byte bound: every one is dropped at once.
    let huge = "x".repeat(QUEUE_BYTES + 1);
    for _ in 0..3 {
        let p = r.pending("cache_hit", false).unwrap();
        r.record(p, end(&huge));
    }
    let status = r.stop();
    assert_eq!((status.dropped, status.lines), (3, 0));
    let _ = std::fs::remove_dir_all(&d);
}

/// A full disk (`/dev/full` answers every write with `ENOSPC`): no line
/// is counted as written, and each lost line is counted once as a write
/// error, not once per failed flush.
#[cfg(target_os = "linux")]
#[test]
fn on_a_full_disk_each_lost_line_counts_once_and_none_as_written() {
    let r = recorder(&RecordTraceConfig::default());
    r.start(Settings {
        path: PathBuf::from("/dev/full"),
        max_bytes: 0,
        keep: 0,
    })
    .unwrap();
    for i in 0..20 {
        let p = r.pending("cache_hit", false).unwrap();
        r.record(p, end(&format!("prompt {i}")));
        // One at a time: the writer empties its queue after each.
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let status = r.stop();
    assert_eq!((status.lines, status.write_errors), (0, 20), "{status:?}");
}

#[test]
fn a_file_that_cannot_be_opened_is_an_error_and_keeps_the_recording() {
    let d = dir("open");
    let r = recorder(&RecordTraceConfig::default());
    let good = d.join("good.jsonl");
    r.start(Settings {
        path: good.clone(),
        max_bytes: 0,
        keep: 0,
    })
    .unwrap();
    let err = r
        .start(Settings {
            path: d.join("missing-dir/t.jsonl"),
            max_bytes: 0,
            keep: 0,
        })
        .unwrap_err();
    assert!(matches!(err, RecordError::Open { .. }), "{err}");
    assert!(err.client_caused());
    let status = r.status();
    assert!(status.recording);
    assert_eq!(status.settings.unwrap().path, good);
    r.stop();
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn admin_paths_stay_inside_the_admin_dir() {
    let base = Path::new("/var/lib/radixgate");
    assert_eq!(
        inside(base, Path::new("t.jsonl")).unwrap(),
        base.join("t.jsonl")
    );
    assert_eq!(
        inside(base, Path::new("day/t.jsonl")).unwrap(),
        base.join("day/t.jsonl")
    );
    assert_eq!(
        inside(base, Path::new("/var/lib/radixgate/x.jsonl")).unwrap(),
        base.join("x.jsonl")
    );
    for bad in [
        "../t.jsonl",
        "a/../../t.jsonl",
        "/etc/passwd",
        "/var/lib/radixgate-other/x",
        "",
        "/",
        "..",
    ] {
        assert!(inside(base, Path::new(bad)).is_err(), "{bad}");
    }
    // A relative admin dir takes relative paths only.
    assert!(inside(Path::new("."), Path::new("/tmp/x")).is_err());
    assert_eq!(
        inside(Path::new("."), Path::new("x")).unwrap(),
        Path::new("./x")
    );
}

/// The admin API records only into the admin dir's own files: not through
/// a link that leads out of it, and not into a file that is not a trace.
#[test]
fn an_admin_recording_goes_through_no_link_and_into_no_other_file() {
    let d = dir("links");
    let admin = d.join("admin");
    let outside = d.join("outside");
    std::fs::create_dir_all(&admin).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("victim.conf"), "keep me\n").unwrap();
    std::os::unix::fs::symlink(outside.join("victim.conf"), admin.join("link.jsonl")).unwrap();
    std::os::unix::fs::symlink(&outside, admin.join("out")).unwrap();
    std::fs::write(admin.join("notes.txt"), "not a trace\n").unwrap();
    let trace = "{\"timestamp\":1,\"input_length\":5,\"output_length\":1,\"hash_ids\":[7]}\n";
    std::fs::write(admin.join("old.jsonl"), trace).unwrap();
    let config = RecordTraceConfig {
        admin_dir: admin.clone(),
        ..RecordTraceConfig::default()
    };
    let r = recorder(&config);
    for bad in ["link.jsonl", "out/t.jsonl", "notes.txt", "."] {
        let err = r.admin_settings(Path::new(bad), None, None).expect_err(bad);
        assert!(matches!(err, RecordError::Path { .. }), "{bad}: {err}");
    }
    for good in ["new.jsonl", "old.jsonl"] {
        let settings = r.admin_settings(Path::new(good), None, None).expect(good);
        assert_eq!(settings.path, admin.join(good));
    }
    // Nor over a file a rotation would rename onto: `FILE.k` up to `keep`.
    std::fs::write(admin.join("day.jsonl.1"), trace).unwrap();
    std::fs::write(admin.join("day.jsonl.3"), "not a trace\n").unwrap();
    let err = r
        .admin_settings(Path::new("day.jsonl"), None, Some(3))
        .expect_err("day.jsonl.3 would be rotated over");
    assert!(err.to_string().contains("day.jsonl.3"), "{err}");
    r.admin_settings(Path::new("day.jsonl"), None, Some(2))
        .expect("day.jsonl.1 is a trace, day.jsonl.2 new");
    assert_eq!(
        std::fs::read_to_string(admin.join("day.jsonl.3")).unwrap(),
        "not a trace\n"
    );
    assert_eq!(
        std::fs::read_to_string(outside.join("victim.conf")).unwrap(),
        "keep me\n"
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// Waits until the running recording has written `n` lines.
fn written(r: &Recorder, n: u64) {
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while r.status().lines < n {
        assert!(Instant::now() < deadline, "{:?}", r.status());
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// A recording's file deleted or moved away while it is written (by hand,
/// by logrotate, by a cleanup job) went on being written where it was: the
/// lines went into the deleted file's space, counted as written, out of
/// sight and never rotated, so `max_bytes` held no more; or into the moved
/// file for good. A file truncated in place (logrotate's copytruncate) was
/// rotated long before it was full. Now the writer follows its path: a
/// deleted or moved file is replaced by a new one at the path, and a
/// truncated one is measured again.
#[test]
fn a_file_deleted_moved_or_truncated_while_recorded_is_followed() {
    let d = dir("follow");
    let path = d.join("t.jsonl");
    let r = recorder(&RecordTraceConfig::default());
    r.start(Settings {
        path: path.clone(),
        max_bytes: 0,
        keep: 0,
    })
    .unwrap();
    let send = |from: usize, n: usize| {
        for i in from..from + n {
            let p = r.pending("cache_hit", false).unwrap();
            r.record(p, end(&format!("prompt {i}")));
        }
    };
    send(0, 3);
    written(&r, 3);
    std::fs::remove_file(&path).unwrap();
    send(3, 2);
    written(&r, 5);
    assert!(path.exists(), "a deleted file is replaced by a new one");
    let moved = d.join("moved.jsonl");
    std::fs::rename(&path, &moved).unwrap();
    send(5, 4);
    assert_eq!(r.stop().lines, 9);
    assert_eq!(lines(&moved).len(), 2, "the lines written before the move");
    assert_eq!(lines(&path).len(), 4, "a new file at the path");

    // Truncated in place: rotation counts from the new size.
    let _ = std::fs::remove_file(&path);
    r.start(Settings {
        path: path.clone(),
        max_bytes: 4000,
        keep: 1,
    })
    .unwrap();
    let one = {
        send(100, 1);
        written(&r, 1);
        std::fs::metadata(&path).unwrap().len()
    };
    let fill = (3000 / one) as usize;
    send(101, fill);
    written(&r, 1 + fill as u64);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(0)
        .unwrap();
    send(200, fill);
    let status = r.stop();
    assert_eq!(status.rotations, 0, "{status:?}");
    assert_eq!(lines(&path).len(), fill);
    let _ = std::fs::remove_dir_all(&d);
}
