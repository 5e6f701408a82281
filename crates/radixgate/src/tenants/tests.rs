use super::*;

fn tenants(yaml: &str, api_key: Option<&str>) -> Tenants {
    let mut config = Config::from_yaml(yaml).expect("YAML");
    config.server.api_key = api_key.map(str::to_owned);
    Tenants::from_config(&config).expect("valid tenants")
}

const TWO: &str = "tenants:
  keys:
    - {name: a, key: sk-a, requests_per_minute: 2, priority: high}
    - {name: b, key: sk-b, tokens_per_minute: 10}
";

#[test]
fn keys_find_their_tenant_and_nothing_else() {
    let set = tenants(TWO, Some("sk-legacy"));
    assert!(!set.is_open());
    assert_eq!(set.find("sk-a").map(|t| t.name()), Some("a"));
    assert_eq!(set.find("sk-b").map(|t| t.name()), Some("b"));
    assert_eq!(set.find("sk-legacy").map(|t| t.name()), Some("default"));
    for wrong in ["", "sk-", "sk-a ", "sk-c", "SK-A"] {
        assert!(set.find(wrong).is_none(), "{wrong:?}");
    }
    assert_eq!(set.names().collect::<Vec<_>>(), ["default", "a", "b"]);
    assert_eq!(set.find("sk-a").unwrap().priority(), Priority::High);
    assert!(tenants("", None).is_open());
    assert!(!format!("{set:?}").contains("sk-"), "Debug hides keys");
}

#[test]
fn the_request_bucket_refuses_with_a_wait() {
    let set = tenants(TWO, None);
    let a = set.find("sk-a").unwrap();
    a.admit().unwrap();
    a.admit().unwrap();
    match a.admit() {
        Err(GatewayError::RateLimited {
            limit: Limit::Requests,
            per_minute: 2,
            retry_after,
            ..
        }) => assert!(retry_after > Duration::ZERO && retry_after <= Duration::from_secs(30)),
        other => panic!("expected a request limit, got {other:?}"),
    }
}

#[test]
fn tokens_are_charged_after_the_fact_with_an_overdraft() {
    let set = tenants(TWO, None);
    let b = set.find("sk-b").unwrap();
    b.admit().unwrap();
    b.charge(4);
    b.admit().expect("6 of 10 left");
    b.charge(25); // 6 paid at once would not cover it: 25 owed
    let wait = match b.admit() {
        Err(GatewayError::RateLimited {
            limit: Limit::Tokens,
            retry_after,
            ..
        }) => retry_after,
        other => panic!("expected a token limit, got {other:?}"),
    };
    // 25 tokens at 10 a minute, less the 6 in the bucket: about two minutes.
    assert!(wait > Duration::from_secs(100), "{wait:?}");
    assert!(wait <= Duration::from_secs(150), "{wait:?}");
    // An unlimited tenant is never charged.
    let a = set.find("sk-a").unwrap();
    a.charge(1_000_000);
    a.admit().unwrap();
}

#[test]
fn a_count_no_answer_could_have_is_owed_without_overflow() {
    let set = tenants(TWO, None);
    let b = set.find("sk-b").unwrap();
    b.charge(u64::MAX);
    b.charge(u64::MAX);
    match b.admit() {
        Err(GatewayError::RateLimited {
            limit: Limit::Tokens,
            retry_after,
            ..
        }) => assert!(retry_after > Duration::from_secs(3600), "{retry_after:?}"),
        other => panic!("expected a token limit, got {other:?}"),
    }
}

#[test]
fn a_reload_keeps_unchanged_buckets() {
    let set = tenants(TWO, None);
    let a = set.find("sk-a").unwrap();
    a.admit().unwrap();
    a.admit().unwrap();
    assert!(a.admit().is_err());
    let same = set
        .reloaded(&Config::from_yaml(TWO).unwrap())
        .expect("reloaded");
    assert!(
        same.find("sk-a").unwrap().admit().is_err(),
        "spent stays spent"
    );
    // A new limit counts the requests of the last minute against it (it
    // handed out a fresh minute).
    let raised = TWO.replace("requests_per_minute: 2", "requests_per_minute: 3");
    let changed = set
        .reloaded(&Config::from_yaml(&raised).unwrap())
        .expect("reloaded");
    let a = changed.find("sk-a").unwrap();
    a.admit().expect("the third of 3");
    assert!(a.admit().is_err(), "3 taken");
    let lowered = TWO.replace("requests_per_minute: 2", "requests_per_minute: 1");
    let changed = set
        .reloaded(&Config::from_yaml(&lowered).unwrap())
        .expect("reloaded");
    assert!(changed.find("sk-a").unwrap().admit().is_err(), "2 of 1");
}

/// Cells given back (requests an overload refused) make the bucket no
/// fuller than a minute's worth: they were credits beside a limiter that
/// refilled on its own, and a tenant whose minute an overload refused could
/// then send its minute's worth twice over at once.
#[test]
fn cells_given_back_never_fill_more_than_a_minute() {
    let bucket = RequestBucket::new(NonZeroU32::new(60).unwrap());
    for _ in 0..60 {
        bucket.take().unwrap();
    }
    assert!(bucket.take().is_err());
    for _ in 0..60 {
        bucket.give_back();
    }
    // A cell comes back every second.
    std::thread::sleep(Duration::from_millis(1500));
    let taken = (0..200).take_while(|_| bucket.take().is_ok()).count();
    assert_eq!(taken, 60, "a minute's worth");
    // And one given back is there to take again.
    bucket.give_back();
    bucket.take().expect("given back");
    assert!(bucket.take().is_err());
}

/// A reload that changes a tenant's token limit keeps what it owes, and
/// what a request in flight charges afterwards (to the bucket it started
/// with) is owed under the new limit.
#[test]
fn a_reload_that_changes_a_token_limit_keeps_the_debt() {
    let set = tenants(TWO, None);
    let b = set.find("sk-b").unwrap();
    b.admit().unwrap();
    b.charge(40); // 30 owed at 10 a minute
    assert!(b.admit().is_err());
    let raised = TWO.replace("tokens_per_minute: 10", "tokens_per_minute: 20");
    let changed = set
        .reloaded(&Config::from_yaml(&raised).unwrap())
        .expect("reloaded");
    let new = changed.find("sk-b").unwrap();
    let wait = match new.admit() {
        Err(GatewayError::RateLimited {
            limit: Limit::Tokens,
            per_minute: 20,
            retry_after,
            ..
        }) => retry_after,
        other => panic!("still owing, under the new limit: {other:?}"),
    };
    // 30 owed, 20 paid at once from the new bucket: 10 at 20 a minute.
    assert!(wait > Duration::from_secs(20), "{wait:?}");
    assert!(wait <= Duration::from_secs(35), "{wait:?}");
    // A request in flight under the old bucket ends and charges it.
    b.charge(100);
    let wait = match new.admit() {
        Err(GatewayError::RateLimited { retry_after, .. }) => retry_after,
        other => panic!("owing the late charge: {other:?}"),
    };
    assert!(wait > Duration::from_secs(300), "{wait:?}");
}

#[test]
fn a_refusal_is_an_openai_rate_limit_answer() {
    use axum::response::IntoResponse;
    let refusal = |wait| GatewayError::RateLimited {
        tenant: "team-a".into(),
        limit: Limit::Tokens,
        per_minute: 100,
        retry_after: wait,
    };
    let err = refusal(Duration::from_millis(2500));
    let body = err.body();
    assert_eq!(body["error"]["type"], "tokens");
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("`team-a`") && message.contains("3s"),
        "{message}"
    );
    let response = err.into_response();
    assert_eq!(response.status(), 429);
    assert_eq!(response.headers()["retry-after"], "3", "rounded up");
    let response = refusal(Duration::ZERO).into_response();
    assert_eq!(response.headers()["retry-after"], "1", "never 0");
}

#[test]
fn inline_media_are_long_base64_runs_and_nothing_else() {
    let image = "iVBORw0KGgoAAAANSUhEUgAA".repeat(100);
    let escaped = "ab\\/cd+=".repeat(200);
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":[
        {{"type":"image_url","image_url":{{"url":"data:image/png;base64,{image}"}}}},
        {{"type":"image_url","image_url":{{"url":"data:image/png;base64,{escaped}"}}}},
        {{"type":"text","text":"{}"}}]}}],"prompt_ids":"{}"}}"#,
        "a long question, with words and punctuation. ".repeat(100),
        "12 345 6789 ".repeat(200),
    );
    assert_eq!(
        InlineMedia::of(body.as_bytes()),
        InlineMedia {
            bytes: image.len() + escaped.len(),
            parts: 2
        }
    );
    assert_eq!(InlineMedia::of(&[]), InlineMedia::default());
    // A run that ends the body counts too; one byte short does not.
    let run = "A".repeat(INLINE_MEDIA_MIN_BYTES);
    assert_eq!(InlineMedia::of(run.as_bytes()).parts, 1);
    assert_eq!(InlineMedia::of(&run.as_bytes()[1..]).parts, 0);
}

/// Text a JSON encoder escaped is text, however long its runs: Chinese as
/// `\uXXXX` (Python's `json.dumps` writes any non-ASCII character so), and
/// lines without spaces joined by `\n`.
#[test]
fn escaped_text_is_not_inline_media() {
    let chinese = r"\u4eca\u5929\u7684\u5929\u6c14\u600e\u4e48\u6837\uff0c\u8bf7\u603b\u7ed3\u4e00\u4e0b\u3002"
        .repeat(40);
    let hashes = r"9fceb02d0ae598e95dc970b74767f19372d61af8\n".repeat(60);
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"{chinese}"}},{{"role":"user","content":"{hashes}"}}]}}"#
    );
    assert_eq!(InlineMedia::of(body.as_bytes()), InlineMedia::default());
}
