//! The optional secret that guards the query API and the status page:
//! `Authorization: Bearer SECRET` (the CLI, scripts), or HTTP Basic with
//! the secret as the password (a browser asks for it by itself).

use anyhow::Context;
use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use std::path::Path;
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// The secret, read once at start.
#[derive(Clone)]
pub struct Token(Arc<[u8]>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// The file's content, trimmed of surrounding white space.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("api: cannot read token_file {}", path.display()))?;
        let secret = text.trim();
        anyhow::ensure!(
            !secret.is_empty(),
            "api: token_file {} is empty",
            path.display()
        );
        Ok(Token(secret.as_bytes().into()))
    }

    fn matches(&self, given: &[u8]) -> bool {
        bool::from(self.0.as_ref().ct_eq(given))
    }

    /// Whether the request's `Authorization` carries the secret.
    fn admits(&self, value: Option<&HeaderValue>) -> bool {
        let Some(text) = value.and_then(|v| v.to_str().ok()) else {
            return false;
        };
        let (scheme, rest) = text.split_once(' ').unwrap_or((text, ""));
        let rest = rest.trim();
        if scheme.eq_ignore_ascii_case("bearer") {
            return self.matches(rest.as_bytes());
        }
        if scheme.eq_ignore_ascii_case("basic") {
            let Ok(decoded) = base64::engine::general_purpose::STANDARD.decode(rest) else {
                return false;
            };
            // `user:password`; the user is not checked.
            let password = match decoded.iter().position(|&b| b == b':') {
                Some(i) => &decoded[i + 1..],
                None => &decoded[..],
            };
            return self.matches(password);
        }
        false
    }
}

/// `routes`, refusing requests without the secret when there is one.
pub fn guard(routes: axum::Router, token: Option<Token>) -> axum::Router {
    match token {
        None => routes,
        Some(token) => routes.layer(axum::middleware::from_fn(
            move |request: Request, next: Next| {
                let token = token.clone();
                async move {
                    if token.admits(request.headers().get(header::AUTHORIZATION)) {
                        next.run(request).await
                    } else {
                        refused()
                    }
                }
            },
        )),
    }
}

fn refused() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(
            header::WWW_AUTHENTICATE,
            "Basic realm=\"fluxpipe\", charset=\"UTF-8\"",
        )],
        axum::Json(serde_json::json!({
            "error": "this server wants its token: Authorization: Bearer TOKEN"
        })),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> Token {
        Token(b"s3cret".as_slice().into())
    }

    fn header(text: &str) -> HeaderValue {
        HeaderValue::from_str(text).unwrap()
    }

    #[test]
    fn bearer_and_basic_with_the_secret_are_let_in() {
        let t = token();
        assert!(t.admits(Some(&header("Bearer s3cret"))));
        assert!(t.admits(Some(&header("bearer  s3cret"))));
        // "anyone:s3cret"
        assert!(t.admits(Some(&header("Basic YW55b25lOnMzY3JldA=="))));
    }

    #[test]
    fn anything_else_is_refused() {
        let t = token();
        assert!(!t.admits(None));
        assert!(!t.admits(Some(&header("Bearer s3cre"))));
        assert!(!t.admits(Some(&header("Bearer s3cretx"))));
        assert!(!t.admits(Some(&header("s3cret"))));
        assert!(!t.admits(Some(&header("Basic !!!"))));
        // "anyone:wrong"
        assert!(!t.admits(Some(&header("Basic YW55b25lOndyb25n"))));
    }
}
