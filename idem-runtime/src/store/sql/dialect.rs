//! [`Dialect`]: one SQL database's statements for the claim records and the toolbox
//! records, implemented once per database in `postgres/`, `mysql/` and `sqlite/`, each
//! on its own pool. A
//! [`SqlStore`] holds one behind an `Arc<dyn Dialect>`, so its `Store` methods call
//! through the trait instead of matching on the database in every method (as sqlx's
//! drivers implement one backend trait each).
//!
//! Every method is one atomic statement (or, where a database needs two, the pair its
//! file documents) decided by the database's clock. What is the same for every database
//! (bounding calls by the timeout, waking waiters, turning a row into a claim outcome)
//! stays in the store.

use std::any::Any;
use std::time::Duration;

use bytes::Bytes;

use super::inspection::Inspected;
use super::journal::{Step, StepRow};
use super::record::Snapshot;
use super::toolbox::{StateRow, StateWrite, ValueRow, ValueWrite};
use super::{BoxFuture, SqlStore};
use crate::store::{ClaimRequest, Owner, StepTransaction, TxConnection, Unreachable};
use crate::{Error, Key};

/// One row of `idem stats`: namespace, function, state, count.
pub(super) type CountRow = (String, String, i16, i64);

/// One SQL database's statements; see the [module docs](self).
pub(super) trait Dialect: Send + Sync + 'static {
    /// `"postgres"`, `"mysql"` (MySQL or MariaDB) or `"sqlite"`.
    fn name(&self) -> &'static str;

    /// The recovery index's statements, if this database keeps one (see `recovery`).
    fn recovery(&self) -> Option<&dyn super::recovery::RecoveryDialect> {
        None
    }

    /// The store's name in logs: `"sql-postgres"`, ...
    fn store_name(&self) -> &'static str;

    /// The database's pool (`sqlx::PgPool`, ...), for the typed accessors.
    fn pool(&self) -> &dyn Any;

    /// One connection attempt beside the pool, to name why the server is unreachable.
    fn probe(&self, within: Duration) -> BoxFuture<'_, Result<(), Unreachable>>;

    /// Claims `key` on a pooled connection (PostgreSQL: batched with concurrent claims
    /// of `store` when it is busy). `None`: the statement lost a race, claim again.
    fn claim<'a>(
        &'a self,
        store: &'a SqlStore,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>>;

    /// Completes `key` for `owner` (PostgreSQL: batched when `store` is busy).
    fn complete<'a>(
        &'a self,
        store: &'a SqlStore,
        key: &'a Key,
        owner: Owner,
        value: &'a Bytes,
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>>;

    fn renew<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        lease: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    fn issue<'a>(&'a self, key: &'a Key, ttl: Duration) -> BoxFuture<'a, Result<bool, Error>>;

    fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Inspected>, Error>>;

    fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>>;

    fn count<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<CountRow>, Error>>;

    /// Deletes up to `batch` expired records.
    fn purge(&self, batch: i64) -> BoxFuture<'_, Result<u64, Error>>;

    /// Claims `key` inside the transaction on `conn` (a connection of this database).
    fn claim_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
        req: &'a ClaimRequest,
    ) -> BoxFuture<'a, Result<Option<Snapshot>, Error>>;

    /// Completes `key` inside the transaction on `conn`.
    fn complete_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
        owner: Owner,
        value: &'a [u8],
        ttl: Duration,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// Runs one statement without parameters (savepoints) on `conn`.
    fn execute_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        sql: &'a str,
    ) -> BoxFuture<'a, Result<(), Error>>;

    /// Journals `step` (see the `journal` module) for `key` if `owner` holds it with a
    /// live lease, and makes the journal expire `step.ttl` from now. One atomic,
    /// owner-checked operation that updates the record's row first. On a pooled
    /// connection of its own, unless the dialect batches step writes (PostgreSQL).
    fn write_step<'a>(
        &'a self,
        _store: &'a SqlStore,
        key: &'a Key,
        owner: Owner,
        step: &'a Step<'a>,
    ) -> BoxFuture<'a, Result<bool, Error>> {
        self.write_step_pooled(key, owner, step)
    }

    /// [`write_step`](Dialect::write_step) on a pooled connection of its own.
    fn write_step_pooled<'a>(
        &'a self,
        key: &'a Key,
        owner: Owner,
        step: &'a Step<'a>,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The same, inside the transaction on `conn` (a transactional step).
    fn write_step_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
        owner: Owner,
        step: &'a Step<'a>,
    ) -> BoxFuture<'a, Result<bool, Error>>;

    /// The live entry rows of `key`'s journal, in the order of their last write.
    fn read_journal<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Vec<StepRow>, Error>>;

    /// The same, inside the transaction on `conn` (a claim in transactional mode).
    fn read_journal_in<'a>(
        &'a self,
        conn: TxConnection<'a>,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Vec<StepRow>, Error>>;

    /// Deletes the entry rows of `key` that are dead (its journal was dropped or started
    /// afresh): never a live one.
    fn drop_dead_steps<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<(), Error>>;

    /// Begins a transaction on a pooled connection (a transactional step's).
    fn begin(&self) -> BoxFuture<'_, Result<StepTransaction, Error>>;

    // ---- The toolbox records (the `toolbox` module decides, in these statements). ----

    /// The live value of `key` in `idem_values`, and its version.
    fn load_value<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<ValueRow>, Error>>;

    /// Runs `write` on the row of `key` in `idem_values`; the rows it changed.
    fn write_value<'a>(
        &'a self,
        key: &'a Key,
        write: ValueWrite<'a>,
    ) -> BoxFuture<'a, Result<u64, Error>>;

    /// The live row of `key` in `idem_states`.
    fn read_state<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<StateRow>, Error>>;

    /// Runs `write` on the row of `key` in `idem_states`; the rows it changed.
    fn write_state<'a>(
        &'a self,
        key: &'a Key,
        write: StateWrite<'a>,
    ) -> BoxFuture<'a, Result<u64, Error>>;

    /// Deletes up to `batch` expired rows of `idem_values`.
    fn purge_values(&self, batch: i64) -> BoxFuture<'_, Result<u64, Error>>;

    /// Deletes up to `batch` expired rows of `idem_states`.
    fn purge_states(&self, batch: i64) -> BoxFuture<'_, Result<u64, Error>>;

    /// Waits for connections in use to be returned, then closes them.
    fn close(&self) -> BoxFuture<'_, ()>;

    /// MySQL only: the same dialect on the two-statement claim that MySQL needs, so
    /// tests exercise that path on MariaDB.
    fn without_returning(&self) -> Option<std::sync::Arc<dyn Dialect>> {
        None
    }
}

/// A connection type of one database, as a [`TxConnection`] carries it.
pub(super) trait OwnConnection {
    /// The connection `conn` carries, if it is of this type.
    fn own(conn: TxConnection<'_>) -> Option<&mut Self>;
}

macro_rules! own_connection {
    ($feature:literal, $conn:ty, $variant:ident) => {
        #[cfg(feature = $feature)]
        impl OwnConnection for $conn {
            fn own(conn: TxConnection<'_>) -> Option<&mut Self> {
                match conn {
                    TxConnection::$variant(c) => Some(c),
                    #[allow(unreachable_patterns)] // with one SQL feature, the only variant
                    _ => None,
                }
            }
        }
    };
}
own_connection!("postgres", sqlx::PgConnection, Postgres);
own_connection!("mysql", sqlx::MySqlConnection, MySql);
own_connection!("sqlite", sqlx::SqliteConnection, Sqlite);

/// The connection of a transaction on this database, or the error a transaction on
/// another database is.
pub(super) fn own_conn<'c, C: OwnConnection>(
    name: &str,
    conn: TxConnection<'c>,
) -> Result<&'c mut C, Error> {
    C::own(conn).ok_or_else(|| {
        Error::Config(format!(
            "the transaction is on another database than the runtime's sql-{name} store"
        ))
    })
}

/// The methods of a [`Dialect`] impl that are the same call on every database, on its
/// own pool and connection type `conn`. Each names the database module's function it
/// calls (they differ by database, their signatures do not), so the contract is at the
/// call site and go-to-definition finds them; each dialect writes the rest itself.
macro_rules! pooled_methods {
    (
        conn: $conn:ty,
        release: $release:path,
        renew: $renew:path,
        inspect: $inspect:path,
        forget: $forget:path,
        count: $count:path,
        purge: $purge:path,
        complete: $complete:path,
        write_step_on: $write_step_on:path,
        read_steps: $read_steps:path,
        drop_dead_steps: $drop_dead_steps:path,
        toolbox: $toolbox:ident $(,)?
    ) => {
        fn pool(&self) -> &dyn std::any::Any {
            &self.pool
        }

        fn release<'a>(&'a self, key: &'a Key, owner: Owner) -> BoxFuture<'a, Result<bool, Error>> {
            Box::pin($release(&self.pool, key, owner))
        }

        fn renew<'a>(
            &'a self,
            key: &'a Key,
            owner: Owner,
            lease: Duration,
        ) -> BoxFuture<'a, Result<bool, Error>> {
            Box::pin($renew(&self.pool, key, owner, lease))
        }

        fn inspect<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<Option<Inspected>, Error>> {
            Box::pin($inspect(&self.pool, key))
        }

        fn forget<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<bool, Error>> {
            Box::pin($forget(&self.pool, key))
        }

        fn count<'a>(
            &'a self,
            namespace: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Vec<super::dialect::CountRow>, Error>> {
            Box::pin($count(&self.pool, namespace))
        }

        fn purge(&self, batch: i64) -> BoxFuture<'_, Result<u64, Error>> {
            Box::pin($purge(&self.pool, batch))
        }

        fn complete_in<'a>(
            &'a self,
            conn: crate::store::TxConnection<'a>,
            key: &'a Key,
            owner: Owner,
            value: &'a [u8],
            ttl: Duration,
        ) -> BoxFuture<'a, Result<bool, Error>> {
            Box::pin(async move {
                let conn = super::dialect::own_conn::<$conn>(self.name(), conn)?;
                $complete(conn, key, owner, value, ttl).await
            })
        }

        fn execute_in<'a>(
            &'a self,
            conn: crate::store::TxConnection<'a>,
            sql: &'a str,
        ) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin(async move {
                let conn = super::dialect::own_conn::<$conn>(self.name(), conn)?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
                    .execute(conn)
                    .await
                    .map(drop)
                    .map_err(Error::store)
            })
        }

        fn load_value<'a>(
            &'a self,
            key: &'a Key,
        ) -> BoxFuture<'a, Result<Option<super::$toolbox::ValueRow>, Error>> {
            Box::pin($toolbox::load_value(&self.pool, key))
        }

        fn write_value<'a>(
            &'a self,
            key: &'a Key,
            write: super::$toolbox::ValueWrite<'a>,
        ) -> BoxFuture<'a, Result<u64, Error>> {
            Box::pin($toolbox::write_value(&self.pool, key, write))
        }

        fn read_state<'a>(
            &'a self,
            key: &'a Key,
        ) -> BoxFuture<'a, Result<Option<super::$toolbox::StateRow>, Error>> {
            Box::pin($toolbox::read_state(&self.pool, key))
        }

        fn write_state<'a>(
            &'a self,
            key: &'a Key,
            write: super::$toolbox::StateWrite<'a>,
        ) -> BoxFuture<'a, Result<u64, Error>> {
            Box::pin($toolbox::write_state(&self.pool, key, write))
        }

        fn purge_values(&self, batch: i64) -> BoxFuture<'_, Result<u64, Error>> {
            Box::pin($toolbox::purge(&self.pool, $toolbox::PURGE_VALUES, batch))
        }

        fn purge_states(&self, batch: i64) -> BoxFuture<'_, Result<u64, Error>> {
            Box::pin($toolbox::purge(&self.pool, $toolbox::PURGE_STATES, batch))
        }

        fn close(&self) -> BoxFuture<'_, ()> {
            Box::pin(self.pool.close())
        }

        fn write_step_pooled<'a>(
            &'a self,
            key: &'a Key,
            owner: Owner,
            step: &'a super::journal::Step<'a>,
        ) -> BoxFuture<'a, Result<bool, Error>> {
            Box::pin(async move {
                let mut conn = self.pool.acquire().await.map_err(Error::store)?;
                $write_step_on(self, &mut conn, false, key, owner, step).await
            })
        }

        fn write_step_in<'a>(
            &'a self,
            conn: crate::store::TxConnection<'a>,
            key: &'a Key,
            owner: Owner,
            step: &'a super::journal::Step<'a>,
        ) -> BoxFuture<'a, Result<bool, Error>> {
            Box::pin(async move {
                let conn = super::dialect::own_conn::<$conn>(self.name(), conn)?;
                $write_step_on(self, conn, true, key, owner, step).await
            })
        }

        fn read_journal<'a>(
            &'a self,
            key: &'a Key,
        ) -> BoxFuture<'a, Result<Vec<super::journal::StepRow>, Error>> {
            Box::pin(async move {
                let mut conn = self.pool.acquire().await.map_err(Error::store)?;
                $read_steps(&mut conn, key, false).await
            })
        }

        fn read_journal_in<'a>(
            &'a self,
            conn: crate::store::TxConnection<'a>,
            key: &'a Key,
        ) -> BoxFuture<'a, Result<Vec<super::journal::StepRow>, Error>> {
            Box::pin(async move {
                let conn = super::dialect::own_conn::<$conn>(self.name(), conn)?;
                $read_steps(conn, key, true).await
            })
        }

        fn drop_dead_steps<'a>(&'a self, key: &'a Key) -> BoxFuture<'a, Result<(), Error>> {
            Box::pin($drop_dead_steps(&self.pool, key))
        }
    };
}
pub(super) use pooled_methods;
