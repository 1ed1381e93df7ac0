//! Redis behind Sentinel (feature `redis-sentinel`): connections to whichever server the
//! sentinels name as the primary of a service, through the redis crate's sentinel
//! client.
//!
//! Each new connection asks the sentinels for the primary's address and checks with
//! `ROLE` that the server there is a primary. A connection that breaks (the primary
//! died) or answers `READONLY` (it was demoted to a replica) is retired by the
//! connection layer, so the next call asks the sentinels again: after a failover, calls
//! reach the new primary without restarting the application. Calls made while no
//! primary is reachable fail with [`Error::Store`] within the store's timeout; the
//! claim was never written, so no body runs.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::sentinel::{SentinelClient, SentinelNodeConnectionInfo, SentinelServerType};

use crate::Error;

/// Where a `redis+sentinel://` URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SentinelUrl {
    /// `redis://host:port` of each sentinel.
    pub(crate) sentinels: Vec<String>,
    pub(crate) service: String,
    pub(crate) db: i64,
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
}

impl SentinelUrl {
    /// Parses `redis+sentinel://[[user]:password@]host:port[,host:port…]/SERVICE[/db]`.
    /// The credentials are those of the data nodes (sentinels are asked without).
    pub(crate) fn parse(url: &str) -> Result<SentinelUrl, Error> {
        let bad = |why: &str| Error::Config(format!("redis+sentinel URL {url:?}: {why}"));
        let rest = url
            .strip_prefix("redis+sentinel://")
            .ok_or_else(|| bad("must start with redis+sentinel://"))?;
        let (authority, path) = rest
            .split_once('/')
            .ok_or_else(|| bad("names no service (…/SERVICE)"))?;
        let (auth, hosts) = match authority.rsplit_once('@') {
            Some((auth, hosts)) => (Some(auth), hosts),
            None => (None, authority),
        };
        let (username, password) = match auth.map(|a| a.split_once(':').unwrap_or((a, ""))) {
            None => (None, None),
            Some((user, pass)) => (
                (!user.is_empty()).then(|| user.to_owned()),
                (!pass.is_empty()).then(|| pass.to_owned()),
            ),
        };
        let sentinels: Vec<String> = hosts
            .split(',')
            .map(|h| {
                if h.is_empty() || !h.contains(':') {
                    Err(bad("each sentinel is host:port"))
                } else {
                    Ok(format!("redis://{h}"))
                }
            })
            .collect::<Result<_, _>>()?;
        let mut parts = path.split('/');
        let service = parts.next().unwrap_or_default();
        if service.is_empty() {
            return Err(bad("names no service (…/SERVICE)"));
        }
        let db = match parts.next() {
            None | Some("") => 0,
            Some(n) => n.parse().map_err(|_| bad("the database is not a number"))?,
        };
        if parts.next().is_some() {
            return Err(bad("expected …/SERVICE or …/SERVICE/db"));
        }
        Ok(SentinelUrl {
            sentinels,
            service: service.to_owned(),
            db,
            username,
            password,
        })
    }
}

/// Makes connections to the current primary.
pub(crate) struct SentinelSource {
    // The sentinel client keeps connections to the sentinels and needs `&mut` to look
    // up; lookups are rare (only to replace a connection), so one at a time is enough.
    client: tokio::sync::Mutex<SentinelClient>,
    config: redis::AsyncConnectionConfig,
}

impl SentinelSource {
    /// `connect`: how long to wait for a connection; `respond`: for any reply.
    pub(crate) fn new(
        url: &SentinelUrl,
        connect: Duration,
        respond: Duration,
    ) -> Result<SentinelSource, Error> {
        let mut info = redis::RedisConnectionInfo::default().set_db(url.db);
        if let Some(u) = &url.username {
            info = info.set_username(u);
        }
        if let Some(p) = &url.password {
            info = info.set_password(p);
        }
        let node = SentinelNodeConnectionInfo::default().set_redis_connection_info(info);
        let client = SentinelClient::build(
            url.sentinels.clone(),
            url.service.clone(),
            Some(node),
            SentinelServerType::Master,
        )
        .map_err(|e| Error::Config(format!("redis sentinel: {e}")))?;
        Ok(SentinelSource {
            client: tokio::sync::Mutex::new(client),
            config: redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(connect))
                .set_response_timeout(Some(respond)),
        })
    }

    /// A connection to the server the sentinels name as primary (checked with `ROLE`).
    /// Not bounded by itself: the caller wraps it in the call's timeout.
    pub(crate) async fn connect(&self) -> Result<MultiplexedConnection, redis::RedisError> {
        let client = self.client.lock().await.async_get_client().await?;
        client
            .get_multiplexed_async_connection_with_config(&self.config)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_sentinels_service_db_and_credentials() {
        let u = SentinelUrl::parse("redis+sentinel://127.0.0.1:26379,h2:26380/shop/3").unwrap();
        assert_eq!(
            u,
            SentinelUrl {
                sentinels: vec!["redis://127.0.0.1:26379".into(), "redis://h2:26380".into()],
                service: "shop".into(),
                db: 3,
                username: None,
                password: None,
            }
        );
        let u = SentinelUrl::parse("redis+sentinel://:pw@h:1/svc").unwrap();
        assert_eq!((u.username, u.password, u.db), (None, Some("pw".into()), 0));
        let u = SentinelUrl::parse("redis+sentinel://app:pw@h:1/svc/").unwrap();
        assert_eq!(u.username.as_deref(), Some("app"));
    }

    #[test]
    fn malformed_urls_are_config_errors() {
        for bad in [
            "redis://h:1/svc",
            "redis+sentinel://h:1",
            "redis+sentinel://h:1/",
            "redis+sentinel://h/svc",
            "redis+sentinel://h:1,/svc",
            "redis+sentinel://h:1/svc/x",
            "redis+sentinel://h:1/svc/1/2",
        ] {
            assert!(
                matches!(SentinelUrl::parse(bad), Err(Error::Config(_))),
                "{bad}"
            );
        }
    }
}
