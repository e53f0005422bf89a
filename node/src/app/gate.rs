//! Who may use the local API, checked on every request before it is routed.
//!
//! The API listens on loopback, but a web page in the user's browser can reach
//! loopback too. Two attacks, two checks (docs/security.md, "The local API"):
//! - cross-site requests (CSRF): a page on another origin POSTs to the API. Browsers
//!   send `Origin` with every POST and every cross-origin fetch; a request whose
//!   `Origin` is not the API's own (the origin of the `Host` it was sent to) is
//!   refused (403), and a JSON endpoint refuses any body not declared
//!   `application/json` (415), which a page can send only after a CORS preflight the
//!   API never grants.
//! - DNS rebinding: the page's own name is made to resolve to 127.0.0.1, so its
//!   requests are same-origin to the browser and their answers readable. The `Host`
//!   they carry is that name: a `Host` other than the listen address, `localhost` or
//!   the bot's `api_public_host` is refused (421 Misdirected Request).
//!
//! Then the bearer token ([`Scope`]): the operator's (`[mesh] api_token_env`) opens
//! everything, a bot's sidecar's (`[[bots]] api_token_env`) all but the operator's
//! switches, a hosted agent's group credential only its group's tools. Every refusal is
//! counted (`botmesh_api_requests{result}`) and logged through the node's one refusal
//! log (`telemetry::refusals`, source `local API`): per result, the first few of each
//! minute, then one line saying how many were not logged, so a page hammering the API
//! cannot flood the log.

use std::net::IpAddr;
use std::sync::LazyLock;

use base64::Engine;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};

use crate::config::NodeConfig;
use crate::ingress::server::{self, Body};
use crate::telemetry::refusals::{RefusalLog, REFUSALS};

/// What a request's bearer token lets it do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Scope {
    /// The operator (or nobody configured a token: loopback only): every endpoint.
    Operator,
    /// The bot's sidecar: post as the bot and read; not [`operator_only`] endpoints.
    Sidecar,
    /// A hosted agent's `mesh` server (`app::group_tools::ToolTokens`): the group
    /// tools (`/v1/tools/…`) of this one group (`None`: of every group, the
    /// built-in model's server), nothing else.
    Tools(Option<String>),
    /// The A2A routes (the Agent Card, `/a2a`): their callers' own tokens are checked
    /// by `app::a2a_edge`, never the API's.
    A2a,
}

/// Endpoints only the operator's token opens: the switches that change what the bot
/// does (a sidecar posts as the bot; it does not silence it or reload its settings).
pub(crate) fn operator_only(path: &str) -> bool {
    matches!(path, "/v1/quiet" | "/v1/reload")
}

/// A request [`admit`] refused: counted and logged already; [`Refusal::answer`] is the
/// response.
#[derive(Debug)]
pub(crate) struct Refusal {
    /// The status to answer with.
    status: StatusCode,
    /// Why, for the JSON error and the log.
    why: String,
}

impl Refusal {
    /// The response to send: `{"error": why}` with its status.
    pub(crate) fn answer(self) -> Response<Body> {
        server::error(self.status, self.why)
    }
}

/// Checks a request's `Host`, `Origin` and token; the scope it may act in, or why not
/// (already counted and logged).
pub(crate) fn admit<B>(
    cfg: &NodeConfig,
    metrics: &crate::telemetry::metrics::Metrics,
    tools: &crate::app::group_tools::ToolTokens,
    req: &Request<B>,
) -> Result<Scope, Refusal> {
    let path = req.uri().path();
    let refused = |label: &'static str, status: StatusCode, why: String| {
        metrics
            .api_requests
            .get_or_create(&crate::telemetry::metrics::ResultLabel {
                result: label.into(),
            })
            .inc();
        log_refusal(&REFUSALS, label, status, req.method(), path, &why);
        Refusal { status, why }
    };
    let host = request_host(req);
    if let Some(h) = &host {
        if !host_allowed(h, cfg) {
            let public = cfg
                .bot()
                .api_public_host
                .as_deref()
                .map(|p| format!(", {p:?}"))
                .unwrap_or_default();
            return Err(refused(
                "bad_host",
                StatusCode::MISDIRECTED_REQUEST,
                format!(
                    "Host {h:?} is not a name of this API (it answers to {}, \"localhost\"{public}; set api_public_host for another)",
                    cfg.api_addr.ip()
                ),
            ));
        }
    }
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let origin = String::from_utf8_lossy(origin.as_bytes());
        if !same_origin(&origin, host.as_deref()) {
            return Err(refused(
                "bad_origin",
                StatusCode::FORBIDDEN,
                format!("Origin {origin:?} is not this API's own: a page elsewhere may not use it"),
            ));
        }
    }
    if crate::app::a2a_edge::is_a2a_path(path) {
        return Ok(Scope::A2a);
    }
    let scope = match scope_of(cfg, tools, req) {
        Some(scope) => scope,
        // Health stays open to probes: it tells nothing a probe should not know.
        None if path == "/healthz" => Scope::Sidecar,
        None => {
            return Err(refused(
                "unauthorized",
                StatusCode::UNAUTHORIZED,
                "missing or wrong bearer token".into(),
            ))
        }
    };
    if matches!(scope, Scope::Tools(_)) && !path.starts_with("/v1/tools/") {
        return Err(refused(
            "forbidden",
            StatusCode::FORBIDDEN,
            format!(
                "{path} is not a group tool: an agent's group credential opens /v1/tools/ only"
            ),
        ));
    }
    if scope == Scope::Sidecar && operator_only(path) {
        return Err(refused(
            "forbidden",
            StatusCode::FORBIDDEN,
            format!("{path} needs the operator's token (mesh.api_token_env); a sidecar's token may post and read"),
        ));
    }
    Ok(scope)
}

/// The scope the request's token grants: `Authorization: Bearer …`, or `?token=` (the
/// page and its event stream, which cannot set headers). `None` for a missing or wrong
/// token; with no token configured everyone is the operator.
fn scope_of<B>(
    cfg: &NodeConfig,
    tools: &crate::app::group_tools::ToolTokens,
    req: &Request<B>,
) -> Option<Scope> {
    let tokens = &cfg.api_tokens;
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string)
        .or_else(|| server::query_param(req.uri(), "token"));
    // A group credential narrows a request to its group's tools even where the API
    // needs no token at all.
    if let Some(group) = given.as_deref().and_then(|t| tools.group_of(t)) {
        return Some(Scope::Tools(group));
    }
    if tokens.operator.is_none() && tokens.sidecar.is_none() {
        return Some(Scope::Operator);
    }
    let given = given?;
    let is = |t: &Option<String>| {
        t.as_ref()
            .is_some_and(|t| crate::wire::signing::constant_time_eq(given.as_bytes(), t.as_bytes()))
    };
    if is(&tokens.operator) {
        Some(Scope::Operator)
    } else if is(&tokens.sidecar) {
        Some(Scope::Sidecar)
    } else {
        None
    }
}

/// The authority the request was sent to: its `Host` header (or the authority of an
/// absolute request URI). `None` when it names none: not a browser, which always does.
fn request_host<B>(req: &Request<B>) -> Option<String> {
    req.headers()
        .get(header::HOST)
        .map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned())
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
}

/// Splits `host[:port]` (`[v6]:port` too) into its host, brackets removed, and port.
fn split_authority(authority: &str) -> (&str, Option<&str>) {
    if let Some(rest) = authority.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (ip, tail.strip_prefix(':')),
            None => (authority, None),
        };
    }
    match authority.rsplit_once(':') {
        Some((h, p)) if !h.contains(':') => (h, Some(p)),
        _ => (authority, None),
    }
}

/// Whether `authority` (a `Host`) names this API: the listen address (any IP address
/// when listening on all of them: an address cannot be rebound), `localhost`, or the
/// bot's `api_public_host`. The port is not compared: a rebinding page's requests carry
/// its own name, whatever the port.
fn host_allowed(authority: &str, cfg: &NodeConfig) -> bool {
    let (host, _) = split_authority(authority.trim());
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.eq_ignore_ascii_case("localhost") {
        return true;
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        let listen = cfg.api_addr.ip();
        return ip == listen || listen.is_unspecified();
    }
    cfg.bot()
        .api_public_host
        .as_deref()
        .is_some_and(|p| host.eq_ignore_ascii_case(p.strip_suffix('.').unwrap_or(p)))
}

/// Whether `origin` (`scheme://host[:port]`) is the origin of a page served from `host`
/// (the request's `Host`, already [`host_allowed`]): `http` or `https` (behind a TLS
/// proxy), the same host and port, default ports written or not. `null` and anything
/// else is not.
fn same_origin(origin: &str, host: Option<&str>) -> bool {
    let Some(host) = host else { return false };
    let Some((scheme, authority)) = origin.trim().split_once("://") else {
        return false;
    };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    let normal = |a: &str| {
        let (h, p) = split_authority(a);
        (
            h.to_ascii_lowercase(),
            p.unwrap_or(default_port).to_string(),
        )
    };
    !authority.contains('/') && normal(authority) == normal(host.trim())
}

/// Whether the headers declare a JSON body (`application/json`, parameters allowed).
fn declares_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|t| t.trim().eq_ignore_ascii_case("application/json"))
}

/// The 415 for a POST whose body is not declared JSON: always when it declares
/// something else; with `body_read` (an endpoint that reads a JSON body) also when it
/// declares nothing. A page on another site can send a body without a CORS preflight
/// only as `text/plain`, form data or multipart: none passes.
pub(crate) fn content_type_refusal(
    headers: &HeaderMap,
    method: &Method,
    path: &str,
    body_read: bool,
) -> Option<Response<Body>> {
    let declared = headers.contains_key(header::CONTENT_TYPE);
    if declares_json(headers) || (!declared && !body_read) {
        return None;
    }
    let why = "the body must be sent as Content-Type: application/json";
    log_refusal(
        &REFUSALS,
        "415",
        StatusCode::UNSUPPORTED_MEDIA_TYPE,
        method,
        path,
        why,
    );
    Some(server::error(StatusCode::UNSUPPORTED_MEDIA_TYPE, why))
}

/// The source the local API's refusals are logged under (see the module doc).
const SOURCE: &str = "local API";

/// Logs one refusal of `result` (the `botmesh_api_requests_total` label) in `log`,
/// unless `log` holds it back (see `telemetry::refusals`).
fn log_refusal(
    log: &RefusalLog,
    result: &'static str,
    status: StatusCode,
    method: &Method,
    path: &str,
    why: &str,
) {
    if log.admit(SOURCE, result) {
        tracing::warn!(status = status.as_u16(), %method, path, result, reason = why, "local API request refused");
    }
}

/// The page's Content-Security-Policy: its one inline script and one inline style by
/// hash, nothing else inline, everything else from its own origin, and no framing
/// (clickjacking).
static PAGE_CSP: LazyLock<HeaderValue> = LazyLock::new(|| {
    let page = crate::app::api::PAGE;
    let hash = |open: &str, close: &str| {
        let start = page.find(open).expect("the page has this element") + open.len();
        let len = page[start..].find(close).expect("and its end");
        let digest =
            ring::digest::digest(&ring::digest::SHA256, &page.as_bytes()[start..start + len]);
        format!(
            "'sha256-{}'",
            base64::engine::general_purpose::STANDARD.encode(digest.as_ref())
        )
    };
    let csp = format!(
        "default-src 'none'; script-src {}; style-src {}; connect-src 'self'; img-src 'self' data:; \
         form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
        hash("<script>", "</script>"),
        hash("<style>", "</style>"),
    );
    HeaderValue::from_str(&csp).expect("a CSP is a valid header value")
});

/// Adds the headers every answer of the local API carries: no content sniffing, no
/// referrer (the page's URL may hold `?token=`), no framing, and the page's CSP.
pub(crate) fn harden(resp: &mut Response<Body>) {
    let h = resp.headers_mut();
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::CONTENT_SECURITY_POLICY, PAGE_CSP.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_with_and_without_ports() {
        assert_eq!(split_authority("a.example:80"), ("a.example", Some("80")));
        assert_eq!(split_authority("a.example"), ("a.example", None));
        assert_eq!(split_authority("[::1]:9"), ("::1", Some("9")));
        assert_eq!(split_authority("[::1]"), ("::1", None));
        assert_eq!(split_authority("127.0.0.1:9"), ("127.0.0.1", Some("9")));
    }

    #[test]
    fn an_origin_is_the_hosts_own_only() {
        let host = Some("127.0.0.1:8102");
        assert!(same_origin("http://127.0.0.1:8102", host));
        assert!(!same_origin("http://127.0.0.1:8103", host));
        assert!(!same_origin("http://evil.example", host));
        assert!(!same_origin("null", host));
        assert!(!same_origin("file://", host));
        assert!(!same_origin("http://127.0.0.1:8102", None));
        assert!(same_origin("https://bots.example", Some("bots.example")));
        assert!(same_origin(
            "https://bots.example",
            Some("bots.example:443")
        ));
        assert!(same_origin("http://Bots.Example:80", Some("bots.example")));
        assert!(!same_origin(
            "https://bots.example",
            Some("bots.example:80")
        ));
    }

    #[test]
    fn only_json_bodies_pass() {
        let with = |ct: Option<&str>| {
            let mut h = HeaderMap::new();
            if let Some(ct) = ct {
                h.insert(header::CONTENT_TYPE, HeaderValue::from_str(ct).unwrap());
            }
            h
        };
        let refused = |ct, body_read| {
            content_type_refusal(&with(ct), &Method::POST, "/x", body_read)
                .map(|r| r.status().as_u16())
        };
        assert_eq!(refused(Some("application/json"), true), None);
        assert_eq!(refused(Some("Application/JSON; charset=utf-8"), true), None);
        assert_eq!(refused(Some("text/plain"), true), Some(415));
        assert_eq!(refused(Some("text/plain"), false), Some(415));
        assert_eq!(refused(None, true), Some(415));
        assert_eq!(refused(None, false), None);
    }

    #[test]
    fn a_flood_of_refusals_is_logged_per_result_by_the_one_refusal_log() {
        use crate::telemetry::refusals::FIRST;
        let log = RefusalLog::new();
        let refuse = |result| {
            log_refusal(
                &log,
                result,
                StatusCode::UNAUTHORIZED,
                &Method::GET,
                "/v1/messages",
                "missing or wrong bearer token",
            )
        };
        let lines = crate::telemetry::test_log::logged(|| {
            for _ in 0..50 {
                refuse("unauthorized");
            }
            // Another result has its own allowance: a flood of one hides no other.
            refuse("bad_origin");
        });
        let refused = lines
            .iter()
            .filter(|(_, m)| m == "local API request refused")
            .count();
        assert_eq!(refused, FIRST as usize + 1, "{lines:?}");
        assert!(lines
            .iter()
            .any(|(_, m)| m.contains("further unauthorized refusals from local API")));
        assert_eq!(log.held_back(SOURCE, "unauthorized"), 50 - FIRST as u64);
        assert_eq!(log.held_back(SOURCE, "bad_origin"), 0);
    }

    #[test]
    fn the_page_has_one_inline_script_and_style_and_no_inline_handlers() {
        let page = crate::app::api::PAGE;
        assert_eq!(
            page.matches("<script").count(),
            1,
            "the CSP hashes one script"
        );
        assert_eq!(
            page.matches("<style").count(),
            1,
            "the CSP hashes one style"
        );
        let handler = regex::Regex::new(r#"<[^>]*\son[a-z]+\s*="#).unwrap();
        assert!(
            !handler.is_match(page),
            "inline handlers are blocked by the CSP"
        );
        assert!(
            !page.contains(" style=\""),
            "style attributes are blocked by the CSP"
        );
    }
}
