//! The fluxpipe host's own accounts (NSS): the fallback for user names
//! Flux's side did not send. They are right only where this host shares
//! the cluster's accounts; a name the forwarder sends always wins.

/// The uid of a name in this host's accounts.
pub fn uid_of_name(name: &str) -> Option<i64> {
    match nix::unistd::User::from_name(name) {
        Ok(Some(u)) => Some(i64::from(u.uid.as_raw())),
        _ => None,
    }
}

/// The name of a uid in this host's accounts.
pub fn name_of_uid(uid: i64) -> Option<String> {
    let uid = u32::try_from(uid).ok()?;
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid)) {
        Ok(Some(u)) => Some(u.name),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_uid_0_both_ways() {
        assert_eq!(uid_of_name("root"), Some(0));
        assert_eq!(name_of_uid(0).as_deref(), Some("root"));
        assert_eq!(name_of_uid(-1), None);
        assert_eq!(uid_of_name("no-such-user-fluxpipe"), None);
    }
}
