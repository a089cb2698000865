//! The request a run sends, from the options: URL, key, method, headers,
//! body, batch, and the job's identity (what is sent, never the key).

use reqwest::header::{HeaderName, HeaderValue};

use super::usage;
use crate::cli::RunArgs;
use crate::exit::RunError;
use crate::input::Format;
use crate::request::{Body, RequestSpec};
use crate::secret::Secret;
use crate::template::Template;

/// The sim's default endpoint: it echoes the item back.
const SIM_DEFAULT_PATH: &str = "/v1/echo";

/// The key a rehearsal sends to the built-in sim.
pub const SIM_KEY: &str = "sim-demo-key";

/// The URL to send to, what of it identifies the job, and whether the body
/// defaults to the item (the sim's echo endpoint).
pub(super) fn url_source(
    args: &RunArgs,
    sim_base: Option<&str>,
) -> Result<(String, String, bool), RunError> {
    Ok(match (sim_base, &args.url) {
        (Some(base), None) => (
            format!("{base}{SIM_DEFAULT_PATH}"),
            format!("sim:{SIM_DEFAULT_PATH}"),
            true,
        ),
        // A rehearsal never leaves the machine: an absolute URL (given, or
        // exported as BATCHRUN_URL for the real runs) keeps its path and
        // query, and its origin becomes the sim's.
        (Some(base), Some(u)) => {
            let path = path_of(u);
            (format!("{base}{path}"), format!("sim:{path}"), false)
        }
        (None, Some(u)) => (u.clone(), u.clone(), false),
        (None, None) => {
            return Err(usage(
                "no --url given (nor BATCHRUN_URL); use --sim to rehearse against the built-in sim"
                    .into(),
            ))
        }
    })
}

/// The path and query of `url` (a template): all of it when it starts with
/// `/`, else what follows its `scheme://host[:port]` (`/` when nothing does).
pub(super) fn path_of(url: &str) -> String {
    if url.starts_with('/') {
        return url.to_string();
    }
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    match rest.find(['/', '?', '#']) {
        Some(at) if rest[at..].starts_with('/') => rest[at..].to_string(),
        Some(at) => format!("/{}", &rest[at..]),
        None => "/".to_string(),
    }
}

/// The stand-in a `--dry-run` shows (hidden) when no key is set: the real
/// run would stop there, and the dry run says so.
pub const DRY_RUN_KEY: &str = "dry-run-no-key";

/// The key to send. A rehearsal sends the sim's demo key, never the one in
/// the environment: the sim needs none, and a real key has no business in
/// a rehearsal's requests.
pub(super) fn api_key(args: &RunArgs, sim: bool) -> Result<Option<Secret>, RunError> {
    if sim {
        return Ok(Some(Secret::new(SIM_KEY)));
    }
    let name = &args.api_key_env;
    let key = match std::env::var(name) {
        // Whitespace around it is no part of a key (a server trims it from
        // the header, and would echo it back trimmed, past the scrubbing).
        Ok(k) if !k.trim().is_empty() => Secret::new(k.trim()),
        // Nothing is sent, and the key is shown hidden anyway.
        _ if args.dry_run.is_some() => Secret::new(DRY_RUN_KEY),
        Ok(_) => {
            return Err(usage(format!(
                "no API key: the environment variable {name} is empty"
            )))
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(usage(format!(
                "the API key in {name} is not valid UTF-8, so no header can carry it"
            )))
        }
        Err(std::env::VarError::NotPresent) => {
            return Err(usage(format!(
            "no API key: set the environment variable {name} (or name another with --api-key-env)"
        )))
        }
    };
    // A header carries bytes beyond ASCII only as Latin-1, and a server
    // echoes them back escaped in ways the scrubbing could not all know.
    if !key.expose().is_ascii() {
        return Err(usage(format!(
            "the API key in {name} holds characters beyond ASCII, which no API key has: \
             check what the variable holds"
        )));
    }
    HeaderValue::from_str(key.expose()).map_err(|_| {
        usage(format!(
            "the API key in {name} contains characters a header cannot carry"
        ))
    })?;
    Ok(Some(key))
}

/// Builds the request spec from the options.
pub(super) fn request_spec(
    args: &RunArgs,
    url_src: &str,
    json_default: bool,
    key: Option<Secret>,
) -> Result<RequestSpec, RunError> {
    let url = Template::parse(url_src).map_err(|e| usage(format!("--url: {e}")))?;
    let body = if args.json_body || (json_default && args.body.is_none()) {
        Body::Item
    } else if let Some(b) = &args.body {
        Body::Template(Template::parse(b).map_err(|e| usage(format!("--body: {e}")))?)
    } else {
        Body::None
    };
    let method = match &args.method {
        Some(m) => reqwest::Method::from_bytes(m.to_ascii_uppercase().as_bytes())
            .map_err(|_| usage(format!("--method {m:?} is not an HTTP method")))?,
        None if matches!(body, Body::None) => reqwest::Method::GET,
        None => reqwest::Method::POST,
    };
    let mut headers = Vec::new();
    let mut key = key;
    // A password in the URL (`https://user:PASS@host/…`) is Basic
    // credentials: kept out of every output as the key is. It was printed
    // by -v, status and --dry-run, and kept in the checkpoint.
    if let (Some(k), Some(password)) = (key.as_mut(), url_password(url_src)) {
        k.also(password);
    }
    for (n, v) in &args.headers {
        let name = HeaderName::from_bytes(n.as_bytes())
            .map_err(|_| usage(format!("--header: {n:?} is not a header name")))?;
        let t = Template::parse(v).map_err(|e| usage(format!("--header {n}: {e}")))?;
        // A credential given here is kept out of every output as the key
        // is (the checkpoint, status, a dry run, errors, echoed bodies).
        if let (Some(k), Some(value)) = (key.as_mut(), credential_value(&name, &t)) {
            k.also(&value);
        }
        headers.push((name, t));
    }
    let key_header = HeaderName::from_bytes(args.api_key_header.as_bytes()).map_err(|_| {
        usage(format!(
            "--api-key-header {:?} is not a header name",
            args.api_key_header
        ))
    })?;
    // The key's header would replace it: the --header never went out.
    if key.is_some() && headers.iter().any(|(n, _)| *n == key_header) {
        return Err(usage(format!(
            "--header {key_header}: that header carries the API key (from {}), which replaces \
             it; put the key in that variable, or name another header for it with \
             --api-key-header",
            args.api_key_env
        )));
    }
    Ok(RequestSpec {
        method,
        url,
        headers,
        body,
        key_header,
        key,
    })
}

/// The value of a `--header` that carries a credential by HTTP's word
/// (`Authorization`, `Proxy-Authorization`), when it is the same for every
/// item: one made of an item's fields is the item's own data.
fn credential_value(name: &HeaderName, t: &Template) -> Option<String> {
    let credential =
        *name == reqwest::header::AUTHORIZATION || *name == reqwest::header::PROXY_AUTHORIZATION;
    let none = crate::input::Item::new(0, serde_json::Value::Null);
    (credential && t.is_static())
        .then(|| t.render(&none, crate::template::Escape::Header).ok())
        .flatten()
}

/// The password of a URL's userinfo (`scheme://user:PASS@host/…`), if
/// it has one.
fn url_password(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let (userinfo, _) = authority.rsplit_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    (!password.is_empty()).then_some(password)
}

/// `--batch` and its options, checked.
pub(super) fn batch_spec(args: &RunArgs) -> Result<Option<crate::request::BatchSpec>, RunError> {
    let Some(size) = args.batch else {
        return Ok(None);
    };
    let pointer = |p: &str, flag: &str| match p.is_empty() || p.starts_with('/') {
        true => Ok(p.to_string()),
        false => Err(usage(format!(
            "{flag} {p:?} is not a JSON pointer (it starts with '/', e.g. /results)"
        ))),
    };
    // Only the default pacer in one process counts a batch as its items:
    // anywhere else, a batch counted as one call would overrun an API that
    // counts each item.
    let fleet = args.redis.as_ref().is_some_and(|u| !u.trim().is_empty());
    if args.batch_weight == crate::request::BatchWeight::Items
        && (fleet || args.pacer != crate::pace::PacerKind::Window)
    {
        return Err(usage(
            "--batch-weight items is kept by the default pacer in one process only: drop --pacer and --redis, or count a batch as one call".to_string(),
        ));
    }
    Ok(Some(crate::request::BatchSpec {
        size: usize::try_from(size).unwrap_or(usize::MAX),
        body: match &args.batch_body {
            Some(t) => Some(crate::request::BatchBody::parse(t).map_err(usage)?),
            None => None,
        },
        results: pointer(&args.batch_results, "--batch-results")?,
        status: match &args.batch_status {
            Some(p) => Some(pointer(p, "--batch-status")?),
            None => None,
        },
        weight: args.batch_weight,
    }))
}

/// The job's identity, and what it was made from when a key had to be
/// hidden from it. A key spelt out in the URL or a header (`?apikey=`, a
/// Bearer token) is kept out of what the checkpoint records and shows; the
/// job's id still comes from the whole text, so a changed key is a new job.
pub(super) fn identity(
    args: &RunArgs,
    spec: &RequestSpec,
    identity_url: &str,
    format_note: Option<Format>,
) -> (String, Option<String>) {
    let mut described = described(args, spec, identity_url);
    if let Some(f) = format_note {
        described.push_str(&format!("\nformat: {f}"));
    }
    let hidden = (spec.key.as_ref())
        .map(|k| k.redact(&described))
        .filter(|h| *h != described);
    match hidden {
        Some(h) => (h, Some(described)),
        None => (described, None),
    }
}

/// What is sent, never the key itself.
fn described(args: &RunArgs, spec: &RequestSpec, identity_url: &str) -> String {
    let mut identity = format!("{} {identity_url}", spec.method);
    for (n, v) in &args.headers {
        identity.push_str(&format!("\n{n}: {v}"));
    }
    match (&spec.body, &args.body) {
        (Body::Item, _) => identity.push_str("\nbody: <item as JSON>"),
        (Body::Template(_), Some(b)) => identity.push_str(&format!("\nbody: {b}")),
        _ => {}
    }
    if let (Some(_), Some(b)) = (args.batch, &args.batch_body) {
        identity.push_str(&format!("\nbatch body: {b}"));
    }
    identity.push_str(&format!("\nkey header: {}", spec.key_header));
    identity
}
