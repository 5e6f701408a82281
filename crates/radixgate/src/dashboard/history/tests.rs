use super::*;
use serde_json::Value;

const INF: f64 = f64::INFINITY;

/// A reading `step` seconds in, with `answers` answered so far.
fn reading(step: u64, answers: u64) -> Reading {
    Reading {
        at_ms: 1_700_000_000_000 + step * 1000,
        mono_ms: step * 1000,
        policy: "cache_aware",
        uptime_secs: step,
        scrape: Scrape {
            answers,
            ..Scrape::default()
        },
        ..Reading::default()
    }
}

fn worker(url: &str, processed: u64) -> WorkerReading {
    WorkerReading {
        role: "regular",
        url: url.into(),
        name: url.trim_start_matches("http://").into(),
        id: Some("w0".into()),
        state: "healthy",
        breaker: "closed",
        in_flight: 2,
        processed,
        tree_chars: Some(1234),
        ..WorkerReading::default()
    }
}

fn push(h: &mut History, r: Reading) -> Value {
    serde_json::from_slice(&h.push(r).unwrap()).unwrap()
}

#[test]
fn rates_need_two_readings_then_cover_the_window() {
    let mut h = History::default();
    let first = push(&mut h, reading(0, 100));
    assert_eq!(first["pool"]["answers_per_sec"], Value::Null);
    assert_eq!(first["series"].as_array().unwrap().len(), 1);
    // 5 answers a second for 4 s, then 50 a second.
    let mut answers = 100;
    let mut last = first;
    for step in 1..=20 {
        answers += if step <= 4 { 5 } else { 50 };
        last = push(&mut h, reading(step, answers));
        if step == 1 {
            assert_eq!(last["pool"]["answers_per_sec"], 5.0);
        }
        if step == 4 {
            assert_eq!(last["pool"]["answers_per_sec"], 5.0);
        }
        if step == 8 {
            // (4 * 5 + 4 * 50) / 8 s: the window reaches back to the start.
            assert_eq!(last["pool"]["answers_per_sec"], 27.5);
        }
        if step == 12 {
            // Steps 3 to 12: two at 5 a second, eight at 50.
            assert_eq!(last["pool"]["answers_per_sec"], 41.0);
        }
    }
    // Ten steps of 50 a second: the slow start has left the window.
    assert_eq!(last["pool"]["answers_per_sec"], 50.0);
    assert_eq!(last["pool"]["answers_total"], answers);
    assert_eq!(last["rate_window_secs"], RATE_WINDOW as u64);
}

#[test]
fn percentiles_come_from_the_window_not_from_the_start() {
    let mut h = History::default();
    let with_ttft = |step: u64, fast: u64, slow: u64| {
        let mut r = reading(step, fast + slow);
        // Fast answers under 10 ms, slow ones between 0.5 and 1 s.
        r.scrape.ttft = Buckets::from_pairs(&[
            (0.01, fast),
            (0.5, fast),
            (1.0, fast + slow),
            (INF, fast + slow),
        ]);
        r
    };
    let first = push(&mut h, with_ttft(0, 1000, 0));
    assert_eq!(first["pool"]["ttft_ms"], Value::Null, "no interval yet");
    // 100 fast answers a second for a while...
    for step in 1..=5 {
        let v = push(&mut h, with_ttft(step, 1000 + step * 100, 0));
        let p50 = v["pool"]["ttft_ms"]["p50"].as_f64().unwrap();
        assert!(p50 <= 10.0, "{p50}");
    }
    // ...then slow ones only: once the fast ones are out of the window,
    // every percentile lies in (500, 1000] ms, though most answers since
    // the start were fast.
    let mut v = Value::Null;
    for step in 6..=20 {
        v = push(&mut h, with_ttft(step, 1500, (step - 5) * 10));
    }
    let ttft = &v["pool"]["ttft_ms"];
    for q in ["p50", "p90", "p99"] {
        let ms = ttft[q].as_f64().unwrap();
        assert!(ms > 500.0 && ms <= 1000.0, "{q} {ms}");
    }
    // p50 of 100 answers spread over (0.5, 1] s: half-way.
    assert!(
        (ttft["p50"].as_f64().unwrap() - 750.0).abs() < 1e-6,
        "{ttft}"
    );
    // Each point carries its own percentiles.
    let series = v["series"].as_array().unwrap();
    assert!(series[3]["ttft_ms"]["p99"].as_f64().unwrap() <= 10.0);
    assert!(series.last().unwrap()["ttft_ms"]["p50"].as_f64().unwrap() > 500.0);
    // Without answers in the window there is no percentile, not a zero.
    for step in 21..=40 {
        v = push(&mut h, with_ttft(step, 1500, 150));
    }
    assert_eq!(v["pool"]["ttft_ms"], Value::Null);
}

#[test]
fn decisions_are_counted_per_step_by_branch() {
    let mut h = History::default();
    let with = |step, hits: u64, imbalanced: u64| {
        let mut r = reading(step, 0);
        r.scrape.decisions.insert("cache_hit".into(), hits);
        if imbalanced > 0 {
            r.scrape.decisions.insert("imbalanced".into(), imbalanced);
        }
        r
    };
    push(&mut h, with(0, 100, 0));
    push(&mut h, with(1, 103, 0));
    let v = push(&mut h, with(2, 110, 2));
    let series = v["series"].as_array().unwrap();
    // The first point has nothing to compare with.
    assert_eq!(series[0]["decisions"], serde_json::json!({}));
    assert_eq!(series[1]["decisions"], serde_json::json!({"cache_hit": 3}));
    assert_eq!(
        series[2]["decisions"],
        serde_json::json!({"cache_hit": 7, "imbalanced": 2})
    );
    assert_eq!(
        v["pool"]["decisions_total"],
        serde_json::json!({"cache_hit": 110, "imbalanced": 2})
    );
}

#[test]
fn the_charts_keep_five_minutes() {
    let mut h = History::default();
    let mut v = Value::Null;
    for step in 0..(HISTORY as u64 + 25) {
        v = push(&mut h, reading(step, step));
    }
    let series = v["series"].as_array().unwrap();
    assert_eq!(series.len(), HISTORY);
    assert_eq!(series[0]["t_ms"], 1_700_000_000_000u64 + 25 * 1000);
    assert_eq!(h.kept.len(), HIT_WINDOW + 1);
    assert_eq!(v["history_secs"], HISTORY as u64);
}

#[test]
fn worker_rows_take_rates_errors_and_hit_rates_from_differences() {
    let mut h = History::default();
    let a = "http://127.0.0.1:1";
    let b = "http://127.0.0.1:2";
    let mut v = Value::Null;
    for step in 0..=12u64 {
        let mut r = reading(step, 0);
        // a: 3 requests a second, 1 failed attempt every other second,
        // reports cached tokens: 40 of every 100 prompt tokens.
        let mut wa = worker(a, 3 * step);
        wa.prompt_tokens = 100 * step;
        wa.reported_tokens = 40 * step;
        r.scrape.upstream_errors.insert(a.into(), step / 2);
        // b: reports nothing; the tree predicted 3 of 4 characters cached
        // for what it answered.
        let wb = worker(b, 2 * step);
        r.predicted.insert(
            b.into(),
            Predicted {
                matched_chars: 30,
                input_chars: 40,
            },
        );
        r.workers = vec![wa, wb];
        v = push(&mut h, r);
    }
    let rows = v["workers"].as_array().unwrap();
    let (ra, rb) = (&rows[0], &rows[1]);
    assert_eq!(ra["url"], a);
    assert_eq!(ra["requests_per_sec"], 3.0);
    assert_eq!(ra["requests_total"], 36);
    assert_eq!(ra["errors_total"], 6);
    assert_eq!(ra["errors_per_sec"], 0.5);
    assert_eq!(ra["cache_hit_rate"], 0.4);
    assert_eq!(ra["cache_hit_source"], "reported");
    assert_eq!(ra["tree_chars"], 1234);
    assert_eq!(rb["requests_per_sec"], 2.0);
    assert_eq!(rb["errors_total"], 0);
    assert_eq!(rb["cache_hit_rate"], 0.75);
    assert_eq!(rb["cache_hit_source"], "predicted");
    assert_eq!(v["pool"]["workers"], 2);
    assert_eq!(v["pool"]["available"], 2);
    assert_eq!(v["pool"]["in_flight"], 4);
}

#[test]
fn a_worker_without_answers_has_no_hit_rate_and_states_pass_through() {
    let mut h = History::default();
    let mut v = Value::Null;
    for step in 0..3 {
        let mut r = reading(step, 0);
        let mut open = worker("http://o", 0);
        open.breaker = "open";
        let mut draining = worker("http://d", 0);
        draining.state = "draining";
        draining.tree_chars = None;
        let mut ejected = worker("http://e", 0);
        ejected.ejected = true;
        r.workers = vec![open, draining, ejected, worker("http://h", 0)];
        v = push(&mut h, r);
    }
    let rows = v["workers"].as_array().unwrap();
    assert_eq!(rows[0]["breaker"], "open");
    assert_eq!(rows[1]["state"], "draining");
    assert_eq!(rows[1]["tree_chars"], Value::Null);
    assert_eq!(rows[2]["ejected"], true);
    for row in rows {
        assert_eq!(row["cache_hit_rate"], Value::Null);
        assert_eq!(row["cache_hit_source"], Value::Null);
        assert_eq!(row["requests_per_sec"], 0.0);
    }
    assert_eq!(v["pool"]["available"], 1);
}

#[test]
fn a_worker_added_later_counts_from_nothing() {
    let mut h = History::default();
    push(&mut h, reading(0, 0));
    let mut r = reading(1, 0);
    r.workers = vec![worker("http://new", 4)];
    let v = push(&mut h, r);
    assert_eq!(v["workers"][0]["requests_per_sec"], 4.0);
}

#[test]
fn a_worker_added_back_at_its_url_counts_only_what_happened_since() {
    let mut h = History::default();
    let url = "http://back";
    // 500 requests done, 30 failed attempts at its URL, then removed.
    let mut r = reading(0, 0);
    r.workers = vec![worker(url, 500)];
    r.scrape.upstream_errors.insert(url.into(), 30);
    push(&mut h, r);
    // Gone for longer than the rate window; its URL's series stays.
    let gone = RATE_WINDOW as u64 + 2;
    for step in 1..=gone {
        let mut r = reading(step, 0);
        r.scrape.upstream_errors.insert(url.into(), 30);
        push(&mut h, r);
    }
    // Back: a new worker (its own counts from 0), the URL's failures
    // counting on from 30, none new.
    let mut v = Value::Null;
    for step in gone + 1..gone + 4 {
        let mut r = reading(step, 0);
        r.workers = vec![worker(url, step - gone)];
        r.scrape.upstream_errors.insert(url.into(), 30);
        v = push(&mut h, r);
        let row = &v["workers"][0];
        assert_eq!(row["errors_total"], 30);
        assert_eq!(row["errors_per_sec"], 0.0, "{row}");
    }
    assert!(v["workers"][0]["requests_per_sec"].as_f64().unwrap() > 0.0);

    // Removed and added back within the window: its requests count from
    // nothing again, not as a negative or a zero rate.
    let mut h = History::default();
    let mut r = reading(0, 0);
    r.workers = vec![worker(url, 500)];
    push(&mut h, r);
    push(&mut h, reading(1, 0));
    let mut r = reading(2, 0);
    r.workers = vec![worker(url, 4)];
    let v = push(&mut h, r);
    assert_eq!(v["workers"][0]["requests_per_sec"], 2.0);
}

#[test]
fn a_disaggregated_pool_counts_each_request_in_flight_once() {
    let mut h = History::default();
    let mut prefill = worker("http://p", 0);
    prefill.role = "prefill";
    prefill.in_flight = 3;
    let mut decode = worker("http://d", 0);
    decode.role = "decode";
    decode.in_flight = 5;
    let mut r = reading(0, 0);
    r.workers = vec![prefill, decode, worker("http://r", 0)];
    let v = push(&mut h, r);
    // Decode's 5 (3 of them prefilling) and the regular worker's 2.
    assert_eq!(v["pool"]["in_flight"], 7);
    assert_eq!(v["workers"][0]["in_flight"], 3);
}

#[test]
fn a_worker_added_back_within_the_window_counts_its_own_figures() {
    let mut h = History::default();
    let url = "http://back";
    // The first worker at the URL: 3 requests, 100 prompt tokens of which
    // 10 reported cached, 2 failed attempts.
    let mut r = reading(0, 0);
    r.workers = vec![WorkerReading {
        prompt_tokens: 100,
        reported_tokens: 10,
        ..worker(url, 3)
    }];
    r.scrape.upstream_errors.insert(url.into(), 2);
    push(&mut h, r);
    // Removed and added back: another worker, whose own counts passed the
    // first one's (8 requests, 400 prompt tokens, 300 cached); no new
    // failure.
    let mut r = reading(2, 0);
    r.workers = vec![WorkerReading {
        id: Some("w1".into()),
        prompt_tokens: 400,
        reported_tokens: 300,
        ..worker(url, 8)
    }];
    r.scrape.upstream_errors.insert(url.into(), 2);
    let v = push(&mut h, r);
    let row = &v["workers"][0];
    assert_eq!(row["requests_per_sec"], 4.0, "{row}");
    assert_eq!(row["cache_hit_rate"], 0.75, "{row}");
    assert_eq!(row["cache_hit_source"], "reported", "{row}");
    assert_eq!(row["errors_total"], 2, "{row}");
    assert_eq!(row["errors_per_sec"], 0.0, "{row}");
}
