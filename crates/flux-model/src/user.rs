//! Who submitted a job. Flux's eventlogs carry only a uid; the name is
//! resolved where Flux runs (the forwarder sends it with `submit`), since
//! the fluxpipe host's accounts need not be the cluster's. Pure: lookups
//! in a local account database happen at the edges, as a fallback.

use compact_str::CompactString;
use thiserror::Error;

/// The longest user name kept: longer than any system allows (glibc's
/// `LOGIN_NAME_MAX` is 256), so a feed cannot make a job hold more.
pub const MAX_NAME_LEN: usize = 256;

/// Why a user name was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum UserNameError {
    #[error("user name is empty")]
    Empty,
    #[error("user name is longer than {MAX_NAME_LEN} bytes")]
    TooLong,
    #[error("user name holds white space or a control character")]
    BadCharacter,
}

/// A user name as sent with a job: non-empty, at most [`MAX_NAME_LEN`]
/// bytes, no white space or control characters (nothing a table, a
/// label or a log line would split on).
pub fn parse_name(text: &str) -> Result<CompactString, UserNameError> {
    check_name(text).map(|()| CompactString::from(text))
}

/// Whether [`parse_name`] takes `text`, without making a copy of it.
pub fn check_name(text: &str) -> Result<(), UserNameError> {
    if text.is_empty() {
        return Err(UserNameError::Empty);
    }
    if text.len() > MAX_NAME_LEN {
        return Err(UserNameError::TooLong);
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(UserNameError::BadCharacter);
    }
    Ok(())
}

/// Which user's jobs a question asks for (`-u`, the API's `user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UserMatch {
    /// By uid (`-u 1000`): whatever name the job carries.
    Id(i64),
    /// By name: jobs whose name from Flux is this one; jobs that came
    /// with no name match by `fallback_uid`, the name's uid in the
    /// asker's own accounts, when it has one.
    Name {
        name: CompactString,
        fallback_uid: Option<i64>,
    },
}

impl UserMatch {
    /// A uid when `text` is a number, else a name (whose fallback uid
    /// `lookup` gives).
    pub fn parse(text: &str, lookup: impl FnOnce(&str) -> Option<i64>) -> Self {
        match text.parse() {
            Ok(uid) => UserMatch::Id(uid),
            Err(_) => UserMatch::Name {
                name: text.into(),
                fallback_uid: lookup(text),
            },
        }
    }

    /// Whether a job of this uid and name (from Flux, if sent) matches.
    pub fn matches(&self, userid: Option<i64>, username: Option<&str>) -> bool {
        match self {
            UserMatch::Id(uid) => userid == Some(*uid),
            UserMatch::Name { name, fallback_uid } => match username {
                Some(n) => n == name.as_str(),
                None => fallback_uid.is_some() && userid == *fallback_uid,
            },
        }
    }

    /// The text a client sends for it (the API's `user`).
    pub fn as_query(&self) -> String {
        match self {
            UserMatch::Id(uid) => uid.to_string(),
            UserMatch::Name { name, .. } => name.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn names_are_checked() {
        assert_eq!(parse_name("alice").as_deref(), Ok("alice"));
        assert_eq!(parse_name("svc-build.01$").as_deref(), Ok("svc-build.01$"));
        assert_eq!(parse_name(""), Err(UserNameError::Empty));
        assert_eq!(parse_name("a b"), Err(UserNameError::BadCharacter));
        assert_eq!(parse_name("a\u{7}"), Err(UserNameError::BadCharacter));
        assert_eq!(
            parse_name(&"x".repeat(MAX_NAME_LEN + 1)),
            Err(UserNameError::TooLong)
        );
    }

    #[test]
    fn a_name_from_flux_wins_over_the_local_accounts() {
        let m = UserMatch::parse("alice", |_| Some(1000));
        // Flux said uid 4242 is alice: a match, whatever the local uid.
        assert!(m.matches(Some(4242), Some("alice")));
        // Flux said uid 1000 is bob: not alice, though locally it is.
        assert!(!m.matches(Some(1000), Some("bob")));
        // No name sent: the local accounts decide.
        assert!(m.matches(Some(1000), None));
        assert!(!m.matches(Some(1001), None));
        let unknown = UserMatch::parse("carol", |_| None);
        assert!(!unknown.matches(Some(1000), None));
        assert!(unknown.matches(Some(7), Some("carol")));
    }

    #[test]
    fn a_number_is_a_uid() {
        let m = UserMatch::parse("1000", |_| panic!("no lookup for a uid"));
        assert_eq!(m, UserMatch::Id(1000));
        assert!(m.matches(Some(1000), Some("anyone")));
        assert!(!m.matches(Some(1001), None));
        assert_eq!(m.as_query(), "1000");
    }

    proptest! {
        #[test]
        fn parse_name_never_panics_and_keeps_what_it_takes(s in "\\PC{0,40}|.{0,300}") {
            if let Ok(n) = parse_name(&s) {
                prop_assert_eq!(n.as_str(), s.as_str());
                prop_assert!(!n.is_empty() && n.len() <= MAX_NAME_LEN);
            }
        }

        #[test]
        fn a_name_query_round_trips(s in "[a-z_][a-z0-9_.-]{0,30}") {
            let m = UserMatch::parse(&s, |_| None);
            prop_assert_eq!(UserMatch::parse(&m.as_query(), |_| None), m);
        }
    }
}
