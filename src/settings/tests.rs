use super::*;
use crate::secret::Secret;

fn run_args(args: &[&str]) -> RunArgs {
    let argv = ["batchrun"]
        .iter()
        .chain(args)
        .map(std::ffi::OsString::from);
    match crate::cli::Cli::parse_with_default(argv).command {
        crate::cli::Command::Run(a) => *a,
        _ => panic!("not a run"),
    }
}

#[test]
fn a_limit_without_concurrency_grows_the_pool_within_the_plan() {
    let sized = |args: &[&str]| {
        let a = run_args(args);
        let (_, most) = plan_limits(&a);
        (most, pool_size(&a, most))
    };
    assert_eq!(sized(&["in.jsonl"]), (1, PoolSize::Fixed), "the free plan");
    assert_eq!(sized(&["in.jsonl", "-p", "pro"]), (20, PoolSize::Fixed));
    assert_eq!(
        sized(&["in.jsonl", "-l", "600/6s"]),
        (GROWN_POOL_CAP, PoolSize::Grows(GROWN_POOL_START))
    );
    assert_eq!(
        sized(&["in.jsonl", "-l", "600/6s", "-p", "starter"]),
        (5, PoolSize::Grows(4)),
        "the plan's ceiling bounds it"
    );
    assert_eq!(
        sized(&["in.jsonl", "-l", "2/1s"]),
        (2, PoolSize::Grows(2)),
        "never more than a window holds"
    );
    assert_eq!(
        sized(&["in.jsonl", "-l", "600/6s", "-c", "3"]),
        (3, PoolSize::Fixed)
    );
    assert_eq!(
        sized(&["in.jsonl", "-l", "none"]),
        (GROWN_POOL_START, PoolSize::Fixed)
    );
}

#[test]
fn default_outputs_sit_beside_the_input() {
    assert_eq!(
        default_output(Path::new("/data/items.jsonl"), "results"),
        PathBuf::from("/data/items.results.jsonl")
    );
    assert_eq!(
        default_output(Path::new("items.csv"), "failures"),
        PathBuf::from("items.failures.jsonl")
    );
    assert_eq!(
        default_output(Path::new("-"), "results"),
        PathBuf::from("stdin.results.jsonl")
    );
    assert_eq!(
        default_output(Path::new("/dev/fd/63"), "failures"),
        PathBuf::from("batchrun.failures.jsonl")
    );
}

#[test]
fn outputs_that_would_clobber_the_input_or_each_other_are_refused() {
    let dir = std::env::temp_dir().join(format!("batchrun-outs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let input = dir.join("items.jsonl");
    std::fs::write(&input, "{}\n").unwrap();
    let other = dir.join("out.jsonl");
    let same = dir.join(".").join("items.jsonl");
    let e = check_outputs(&input, &same, &other)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is the input file"), "{e}");
    let e = check_outputs(&input, &other, &input)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--failures"), "{e}");
    let e = check_outputs(&input, &other, &other)
        .unwrap_err()
        .to_string();
    assert!(e.contains("same file"), "{e}");
    let e = check_outputs(&input, &dir, &other).unwrap_err().to_string();
    assert!(e.contains("is a directory"), "{e}");
    assert!(check_outputs(&input, &other, &dir.join("f.jsonl")).is_ok());
    // The joblog is appended to: never the input or an output.
    let f = dir.join("f.jsonl");
    let state = dir.join("state");
    for (joblog, names) in [
        (&same, "is the input file"),
        (&other, "is --out"),
        (&f, "is --failures"),
    ] {
        let e = check_joblog((&input, &other, &f), &state, joblog)
            .unwrap_err()
            .to_string();
        assert!(e.contains(names) && e.starts_with("--joblog "), "{e}");
    }
    assert!(check_joblog((&input, &other, &f), &state, &dir.join("calls.tsv")).is_ok());
    // A hard link is the same file under another name.
    let hard = dir.join("hard.jsonl");
    std::fs::hard_link(&input, &hard).unwrap();
    let e = check_joblog((&input, &other, &f), &state, &hard)
        .unwrap_err()
        .to_string();
    assert!(e.contains("is the input file"), "{e}");
    let e = check_outputs(&input, &hard, &f).unwrap_err().to_string();
    assert!(e.contains("is the input file"), "{e}");
    // A link to where --out will be, before it exists, is --out too
    // (relative, and through a second link).
    let to_out = dir.join("to-out.jsonl");
    let twice = dir.join("twice.jsonl");
    std::os::unix::fs::symlink("new-out.jsonl", &to_out).unwrap();
    std::os::unix::fs::symlink(&to_out, &twice).unwrap();
    for link in [&to_out, &twice] {
        let e = check_outputs(&input, &dir.join("new-out.jsonl"), link)
            .unwrap_err()
            .to_string();
        assert!(e.contains("same file"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn limit_args(extra: &[&str]) -> RunArgs {
    let argv = ["batchrun", "run", "in.jsonl"].iter().chain(extra);
    let argv = argv.map(std::ffi::OsString::from);
    match crate::cli::Cli::parse_with_default(argv).command {
        crate::cli::Command::Run(a) => *a,
        _ => panic!("expected run"),
    }
}

#[test]
fn the_primary_limit_is_the_slowest_and_the_others_follow() {
    let a = limit_args(&["--limit", "20/1s", "--limit", "30/3s", "--limit", "1000/1h"]);
    let all: Vec<String> = all_limits(&a).iter().map(ToString::to_string).collect();
    assert_eq!(all, ["1000/1h", "30/3s", "20ps"]);
    assert_eq!(checked_limits(&a).unwrap().len(), 3);
    assert_eq!(
        all_limits(&limit_args(&[]))[0],
        PolicySpec::sliding(crate::rate::Plan::Free.limit())
    );
    assert_eq!(
        checked_limits(&limit_args(&["--limit", "5ps"]))
            .unwrap()
            .len(),
        1
    );
    // One --limit with --redis is the fleet's usual case.
    assert!(checked_limits(&limit_args(&["--limit", "5ps", "--redis", "redis://h"])).is_ok());
}

#[test]
fn shapes_are_refused_where_they_cannot_be_kept() {
    // A token policy is never the primary one while a call policy is given.
    let a = limit_args(&["--limit", "90000/1m,tokens", "--limit", "30/1s,burst=5"]);
    assert_eq!(all_limits(&a)[0].to_string(), "30ps,burst=5");
    assert!(checked_limits(&a).is_ok());
    // The fleet keeps buckets and fixed windows of calls.
    let bucket = limit_args(&["--limit", "30/1s,burst=5", "--redis", "redis://h"]);
    assert!(checked_limits(&bucket).is_ok());
    let fixed = limit_args(&["--limit", "1000/1d,fixed", "--redis", "redis://h"]);
    assert!(checked_limits(&fixed).is_ok());
    // And windows and buckets of tokens.
    for t in [
        "9000/1m,tokens",
        "9000/1m,fixed,tokens",
        "9000/1m,burst=900,tokens",
    ] {
        let a = limit_args(&["--limit", "30/1s", "--limit", t, "--redis", "redis://h"]);
        assert!(checked_limits(&a).is_ok(), "{t}");
    }
    for (extra, says) in [
        (
            &["--limit", "30/1s,burst=5", "--pacer", "bucket"][..],
            "window pacer",
        ),
        (
            &["--limit", "1000/1d,fixed", "--pacer", "spike"][..],
            "window pacer",
        ),
    ] {
        let e = checked_limits(&limit_args(extra)).unwrap_err().to_string();
        assert!(e.contains(says), "{extra:?}: {e}");
    }
}

#[test]
fn a_rehearsal_keeps_only_the_path_and_query_of_an_absolute_url() {
    assert_eq!(request::path_of("/v1/echo?n={n}"), "/v1/echo?n={n}");
    assert_eq!(
        request::path_of("https://api.example.com:8443/v1/x?n={n}"),
        "/v1/x?n={n}"
    );
    assert_eq!(request::path_of("https://api.example.com?n={n}"), "/?n={n}");
    assert_eq!(request::path_of("https://api.example.com"), "/");
    assert_eq!(request::path_of("api.example.com/v1/x"), "/v1/x");
}

proptest::proptest! {
    /// Whatever `--url` says, a rehearsal's URL is the sim's origin
    /// followed by a path: nothing in it can name another host.
    #[test]
    fn a_rehearsal_url_never_names_another_host(
        u in "((https?|ftp)://)?[a-z0-9@:./\\[\\]]{0,16}([/?#][ -~]{0,24})?|.*"
    ) {
        let path = request::path_of(&u);
        proptest::prop_assert!(path.starts_with('/'), "{path:?}");
    }
}

#[test]
fn a_rehearsal_sends_the_sim_key_never_the_exported_one() {
    // A variable of this test's own: no other test reads it.
    std::env::set_var("BATCHRUN_TEST_REHEARSAL_KEY", "sk_live_REAL");
    let cli = crate::cli::Cli::parse_with_default(
        [
            "batchrun",
            "items.jsonl",
            "--sim",
            "--api-key-env",
            "BATCHRUN_TEST_REHEARSAL_KEY",
            "--url",
            "https://api.example.com/v1/x?n={n}",
        ]
        .map(std::ffi::OsString::from),
    );
    let crate::cli::Command::Run(args) = cli.command else {
        panic!("not a run")
    };
    let s = Settings::from_cli(&args, Some("http://127.0.0.1:9")).unwrap();
    let key = s.request.key.as_ref().unwrap();
    assert_eq!(key.expose(), SIM_KEY);
    assert!(s.rehearsal);
    assert_eq!(s.origin, "sim");
    assert_eq!(s.request.url.as_str(), "http://127.0.0.1:9/v1/x?n={n}");
}

#[test]
fn a_key_beyond_ascii_is_refused_without_showing_it() {
    // A variable of this test's own: no other test reads it.
    std::env::set_var("BATCHRUN_TEST_NON_ASCII_KEY", "k\"ey-th\u{e9}-Q9Z7");
    let args = run_args(&[
        "items.jsonl",
        "--url",
        "https://api.example.com/v1/x",
        "--api-key-env",
        "BATCHRUN_TEST_NON_ASCII_KEY",
    ]);
    let e = request::api_key(&args, false).unwrap_err().to_string();
    assert!(e.contains("beyond ASCII"), "{e}");
    assert!(!e.contains("Q9Z7"), "{e}");
}

#[test]
fn a_header_the_key_would_replace_is_refused() {
    let args = run_args(&[
        "items.jsonl",
        "-H",
        "X-Api-Key: other",
        "--url",
        "https://h/x",
    ]);
    let spec = |key| request::request_spec(&args, "https://h/x", false, key);
    let e = spec(Some(Secret::new("k"))).unwrap_err().to_string();
    assert!(
        e.contains("--header x-api-key") && e.contains("--api-key-header"),
        "{e}"
    );
    // Another header for the key: both go.
    let args = run_args(&[
        "items.jsonl",
        "-H",
        "X-Api-Key: other",
        "--api-key-header",
        "Authorization",
    ]);
    assert!(request::request_spec(&args, "https://h/x", false, Some(Secret::new("k"))).is_ok());
}

#[test]
fn the_key_never_shows_in_debug() {
    assert_eq!(format!("{:?}", Secret::new("sk_live_123")), "Secret(***)");
}

#[test]
fn batch_weight_items_is_refused_where_it_cannot_be_kept() {
    let args = |extra: &[&str]| {
        let mut v = vec!["--batch", "10", "--batch-weight", "items"];
        v.extend_from_slice(extra);
        limit_args(&v)
    };
    for extra in [&["--pacer", "bucket"][..], &["--redis", "redis://h"][..]] {
        let e = batch_spec(&args(extra)).unwrap_err().to_string();
        assert!(e.contains("--batch-weight items"), "{extra:?}: {e}");
    }
    assert!(batch_spec(&args(&[])).is_ok());
}

/// Only a bare rate's shape is unknown: a plan's window and a shape named
/// with `--limit` are not learnt from the start.
#[test]
fn a_bare_rate_alone_leaves_the_shape_unknown() {
    let primary_named = |extra: &[&str]| all_limits(&limit_args(extra))[0].named;
    assert!(!primary_named(&["--limit", "30/1s"]));
    assert!(primary_named(&["--limit", "30/1s,sliding"]));
    assert!(primary_named(&["--limit", "30/1s,burst=5"]));
    assert!(primary_named(&["--plan", "starter"]));
    assert!(primary_named(&[]), "the default plan");
    // A bare rate and a named sliding window are the same policy otherwise.
    let bare = all_limits(&limit_args(&["--limit", "30/1s"]))[0];
    let named = all_limits(&limit_args(&["--limit", "30/1s,sliding"]))[0];
    assert_eq!(bare, named);
    assert_eq!(bare.to_string(), named.to_string());
}

#[test]
fn the_most_a_call_may_weigh_is_the_least_a_told_policy_of_tokens_admits_at_once() {
    let most = |all: &[&str]| {
        let specs: Vec<PolicySpec> = all.iter().map(|s| s.parse().unwrap()).collect();
        limits::most_at_once(&specs, |_| true)
    };
    assert_eq!(most(&["30/1s"]), None);
    assert_eq!(
        most(&["30/1s", "900/1m,tokens"]),
        Some((900, "900/1m,tokens".into()))
    );
    // A bucket admits its burst and one; one whose burst is not told, no
    // known amount.
    let b = most(&[
        "900/1m,tokens",
        "300/1s,burst=60,tokens",
        "100/1s,bucket,tokens",
    ]);
    assert_eq!(b, Some((61, "300ps,burst=60,tokens".into())));
}
