//! Moves of a [`StateMachine`] whose state lives in the application's own table
//! (`orders.status`), not in idem's store: one guarded `UPDATE` per move, so the table
//! stays the only source of truth.

use sqlx::{Acquire, Encode, Type};

use super::{Moved, StateMachine};
use crate::store::BoxFuture;
use crate::{Error, Key};

/// PostgreSQL's limit (MySQL allows 64); one limit for all keeps a table portable.
const MAX_IDENT: usize = 63;

/// How many times a move is tried when its row moved into an allowed source state
/// between the guarded `UPDATE`s and the read that classifies the refusal (possible only
/// with a cycle in the table, outside a transaction).
const ROUNDS: usize = 8;

/// A [`StateMachine`] whose state is a column of the application's own table: the
/// table is the only source of truth, and idem's store is not used.
///
/// Made by [`StateMachine::stored_in`], which checks the names once. A move is one
/// atomic, guarded statement on the row:
///
/// ```sql
/// UPDATE "orders" SET "status" = 'paid' WHERE "id" = $1 AND "status" = 'created'
/// ```
///
/// (one such statement per state the table allows into the target, tried in turn, so
/// the state the row left is known exactly; a move into an initial state also takes a
/// row whose state is `NULL`). When no statement changed the row, one read tells why:
///
/// - the row is already at the target → [`Moved::AlreadyThere`], no effect;
/// - the row is in a state the table does not allow the move from →
///   [`Error::InvalidTransition`] with that state (`from: None` for a `NULL` state);
/// - no row has that id → [`Error::NoSuchRow`].
///
/// Works on PostgreSQL, MySQL/MariaDB and SQLite, through a pool, an open transaction
/// or a connection (anything that is [`sqlx::Acquire`]). The states are written into
/// the SQL as literals, so a PostgreSQL `ENUM` column works as well as a text one.
///
/// See the [guide](super#own-table) for the recipe and the idempotent create.
#[derive(Debug, Clone)]
pub struct StateColumn {
    machine: StateMachine,
    /// As given (`schema.table` or `table`), for errors.
    table: String,
    table_parts: Vec<String>,
    id: String,
    column: String,
}

impl StateMachine {
    /// Binds this machine to the column that holds its state in the application's own
    /// table: `table` (optionally `schema.table`), the row's id column `id_column` (a
    /// primary or unique key) and the state column `state_column`.
    ///
    /// The names are written into the SQL (quoted, so they match exactly as stored: an
    /// unquoted `CREATE TABLE Orders` is `orders` to PostgreSQL), hence checked here:
    /// letters, digits and `_`, not starting with a digit, at most 63 bytes each.
    /// Anything else is [`Error::Config`]. So are states that cannot be written as SQL
    /// literals (a `'`, a `\` or a control character).
    ///
    /// ```
    /// use idem_runtime::Error;
    /// use idem_runtime::toolbox::StateMachine;
    /// let orders = StateMachine::builder("shop::order")
    ///     .states(["created", "paid"])
    ///     .initial("created")
    ///     .allow("created", ["paid"])
    ///     .build()?;
    /// assert!(orders.stored_in("shop.orders", "id", "status").is_ok());
    /// let bad = orders.stored_in("orders; DROP TABLE orders", "id", "status");
    /// assert!(matches!(bad, Err(Error::Config(_))));
    /// # Ok::<(), Error>(())
    /// ```
    pub fn stored_in(
        &self,
        table: &str,
        id_column: &str,
        state_column: &str,
    ) -> Result<StateColumn, Error> {
        let mut problems = Vec::new();
        let parts: Vec<&str> = table.split('.').collect();
        if parts.len() > 2 {
            problems.push(format!(
                "table {table:?} has more than one `.`: write `table` or `schema.table`"
            ));
        }
        for part in &parts {
            check_ident("table", table, part, &mut problems);
        }
        check_ident("id column", id_column, id_column, &mut problems);
        check_ident("state column", state_column, state_column, &mut problems);
        for s in &self.states {
            if s.chars().any(|c| c == '\'' || c == '\\' || c.is_control()) {
                problems.push(format!(
                    "state {s:?} holds a quote, a backslash or a control character, \
                     which an SQL literal cannot carry portably"
                ));
            }
        }
        if !problems.is_empty() {
            return Err(Error::Config(format!(
                "state machine {} on a table: {}",
                self.name,
                problems.join("; ")
            )));
        }
        Ok(StateColumn {
            machine: self.clone(),
            table: table.to_owned(),
            table_parts: parts.into_iter().map(str::to_owned).collect(),
            id: id_column.to_owned(),
            column: state_column.to_owned(),
        })
    }
}

fn check_ident(what: &str, whole: &str, part: &str, problems: &mut Vec<String>) {
    let mut chars = part.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain || part.len() > MAX_IDENT {
        problems.push(format!(
            "{what} {whole:?} is not a plain SQL name (letters, digits and _, \
             not starting with a digit, at most {MAX_IDENT} bytes)"
        ));
    }
}

/// The statements of one move, built from checked names and declared states only.
struct Plan {
    /// One guarded `UPDATE` per state the move may leave (`None`: a `NULL` state).
    moves: Vec<(Option<&'static str>, String)>,
    /// Reads the row's state, locking it where the database can, so that the read sees
    /// the row as the next `UPDATE` will (MySQL's plain reads in a transaction see an
    /// older snapshot).
    read: String,
}

impl StateColumn {
    /// The machine.
    pub fn machine(&self) -> &StateMachine {
        &self.machine
    }

    /// The table, as given.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Moves the row whose id column equals `id` to `to`, on `conn`: a pool
    /// (`&PgPool`, ...), an open transaction (`&mut tx`) or a connection.
    ///
    /// - moved by this call → [`Moved::Performed`] with the state it left;
    /// - already at `to` → [`Moved::AlreadyThere`], nothing written;
    /// - a state the table does not allow the move from →
    ///   [`Error::InvalidTransition`] (terminal states stay terminal);
    /// - no such row → [`Error::NoSuchRow`]; `to` not a state of the machine →
    ///   [`Error::Config`].
    ///
    /// `id` is bound as a parameter of its own SQL type (`i64`, `&str`, a `Uuid` with
    /// sqlx's `uuid` feature, ...). Outside a transaction each statement commits on its
    /// own, and only the one that moves the row writes anything.
    ///
    /// ```no_run
    /// use idem_runtime::store::sql::sqlx::PgPool;
    /// use idem_runtime::Error;
    /// use idem_runtime::toolbox::{StateMachine, Moved};
    ///
    /// # async fn demo(pool: PgPool) -> Result<(), Error> {
    /// let orders = StateMachine::builder("shop::order")
    ///     .states(["created", "paid", "cancelled"])
    ///     .initial("created")
    ///     .allow("created", ["paid", "cancelled"])
    ///     .terminal(["paid", "cancelled"])
    ///     .build()?
    ///     .stored_in("orders", "id", "status")?;
    /// match orders.transition(&pool, 42_i64, "paid").await? {
    ///     Moved::Performed { .. } => { /* this call paid the order */ }
    ///     Moved::AlreadyThere => { /* a retry: it was paid before */ }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn transition<'c, A, I>(&self, conn: A, id: I, to: &str) -> Result<Moved, Error>
    where
        A: Acquire<'c>,
        A::Database: StateDatabase,
        I: for<'q> Encode<'q, A::Database> + Type<A::Database> + Send + Sync,
    {
        let plan = self.plan::<A::Database>(to)?;
        let mut conn = conn.acquire().await.map_err(Error::store)?;
        self.decide::<A::Database, I>(&mut conn, &plan, &id, to)
            .await
    }

    /// Moves the row to `to` and runs `body` in the same database transaction, so the
    /// move and the body's writes commit together or not at all. The body runs only
    /// for the caller that performs the move:
    ///
    /// - moved → `body` runs with the transaction; `Ok` → committed,
    ///   `Ok(Moved::Performed { from, value })`; `Err` → rolled back (the row keeps
    ///   its state, a retry can move it) and the error is returned;
    /// - already at `to` → `Ok(Moved::AlreadyThere)`, the body does not run;
    /// - refused → the errors of [`transition`](Self::transition), the body does not run.
    ///
    /// On a pool or a connection this opens a transaction and commits it; inside your
    /// transaction (`&mut tx`) it works behind a savepoint and your commit decides.
    /// The row stays locked while the body runs (other movers of that row wait, within
    /// the database's lock timeout), and a dropped call rolls back. An effect outside
    /// the database (a call to a carrier) is not rolled back with it: write it as a row
    /// in the transaction (an outbox) for it to be tied to the move.
    ///
    /// ```no_run
    /// use idem_runtime::store::sql::sqlx::{self, PgPool};
    /// use idem_runtime::Error;
    /// use idem_runtime::toolbox::{StateMachine, Moved};
    ///
    /// # async fn demo(pool: PgPool) -> Result<(), Error> {
    /// let orders = StateMachine::builder("shop::order")
    ///     .states(["paid", "shipped"])
    ///     .initial("paid")
    ///     .allow("paid", ["shipped"])
    ///     .build()?
    ///     .stored_in("orders", "id", "status")?;
    /// let step = orders
    ///     .transition_with(&pool, 42_i64, "shipped", |tx| {
    ///         Box::pin(async move {
    ///             sqlx::query("INSERT INTO shipments (order_id) VALUES ($1)")
    ///                 .bind(42_i64)
    ///                 .execute(&mut **tx)
    ///                 .await
    ///                 .map_err(Error::store)?;
    ///             Ok::<_, Error>("queued")
    ///         })
    ///     })
    ///     .await?;
    /// assert!(matches!(step, Moved::Performed { .. } | Moved::AlreadyThere));
    /// # Ok(()) }
    /// ```
    pub async fn transition_with<'c, A, I, T, E, F>(
        &self,
        conn: A,
        id: I,
        to: &str,
        body: F,
    ) -> Result<Moved<T>, E>
    where
        A: Acquire<'c>,
        A::Database: StateDatabase,
        I: for<'q> Encode<'q, A::Database> + Type<A::Database> + Send + Sync,
        E: From<Error>,
        F: for<'t> FnOnce(
            &'t mut sqlx::Transaction<'c, A::Database>,
        ) -> BoxFuture<'t, Result<T, E>>,
    {
        let plan = self.plan::<A::Database>(to)?;
        let mut tx = conn.begin().await.map_err(Error::store)?;
        let decided = self.decide::<A::Database, I>(&mut tx, &plan, &id, to).await;
        let from = match decided {
            Ok(Moved::Performed { from, .. }) => from,
            other => {
                // Nothing was written; the rollback only ends the transaction and
                // drops the row lock the classifying read took.
                let _ = tx.rollback().await;
                return match other {
                    Ok(_) => Ok(Moved::AlreadyThere),
                    Err(e) => Err(e.into()),
                };
            }
        };
        match body(&mut tx).await {
            Ok(value) => {
                tx.commit().await.map_err(Error::store)?;
                Ok(Moved::Performed { from, value })
            }
            Err(e) => {
                // A failed rollback still ends with the connection: the database drops
                // the transaction when the session goes.
                let _ = tx.rollback().await;
                Err(e)
            }
        }
    }

    fn plan<DB: StateDatabase>(&self, to: &str) -> Result<Plan, Error> {
        // Only declared states reach the SQL text, never the caller's string.
        let (to, sources) = self
            .machine
            .states
            .iter()
            .find(|s| **s == to)
            .and_then(|s| Some((*s, self.machine.sources.get(s)?)))
            .ok_or_else(|| {
                Error::Config(format!(
                    "state machine {} has no state {to:?}",
                    self.machine.name
                ))
            })?;
        let quote = |name: &str| format!("{q}{name}{q}", q = DB::QUOTE);
        let table = self
            .table_parts
            .iter()
            .map(|p| quote(p))
            .collect::<Vec<_>>()
            .join(".");
        let (id, col, param) = (quote(&self.id), quote(&self.column), DB::PARAM);
        let set = format!("UPDATE {table} SET {col} = '{to}' WHERE {id} = {param} AND {col}");
        let mut moves: Vec<_> = sources
            .iter()
            .map(|&from| (Some(from), format!("{set} = '{from}'")))
            .collect();
        if self.machine.initial.contains(&to) {
            moves.push((None, format!("{set} IS NULL")));
        }
        let read = format!(
            "SELECT CAST({col} AS {text}) FROM {table} WHERE {id} = {param}{lock}",
            text = DB::TEXT,
            lock = DB::LOCK
        );
        Ok(Plan { moves, read })
    }

    /// Tries the guarded moves, then reads the row to classify a refusal.
    async fn decide<DB: StateDatabase, I>(
        &self,
        conn: &mut DB::Connection,
        plan: &Plan,
        id: &I,
        to: &str,
    ) -> Result<Moved, Error>
    where
        I: for<'q> Encode<'q, DB> + Type<DB> + Sync,
    {
        let mut candidates: Vec<&(Option<&'static str>, String)> = plan.moves.iter().collect();
        for _ in 0..ROUNDS {
            for (from, sql) in candidates {
                match DB::update(conn, sql, id).await? {
                    0 => {}
                    1 => {
                        return Ok(Moved::Performed {
                            from: from.map(str::to_owned),
                            value: (),
                        });
                    }
                    n => {
                        return Err(Error::Config(format!(
                            "a move on {} changed {n} rows: {} must name one row \
                             (a primary or unique key)",
                            self.table, self.id
                        )));
                    }
                }
            }
            let current = match DB::read(conn, &plan.read, id).await? {
                None => {
                    return Err(Error::NoSuchRow {
                        table: self.table.clone(),
                    });
                }
                Some(current) => current,
            };
            if current.as_deref() == Some(to) {
                return Ok(Moved::AlreadyThere);
            }
            if !self.machine.allows(current.as_deref(), to) {
                return Err(Error::InvalidTransition {
                    from: current,
                    to: to.to_owned(),
                });
            }
            // Another caller moved the row into a state we may leave, after our
            // statement for that state ran: try that one again.
            candidates = plan
                .moves
                .iter()
                .filter(|(from, _)| *from == current.as_deref())
                .collect();
        }
        Err(Error::Conflict {
            key: Key::new(
                self.machine.name,
                "state-column",
                format_args!("{}.{}", self.table, self.column),
            ),
        })
    }
}

/// What idem does with a [`StateDatabase`], out of users' reach: the supertrait is public
/// (so the bound is) but cannot be named outside this module, so no other type can
/// implement it and its items are nobody's API.
mod sealed {
    use sqlx::{Encode, Type};

    use crate::Error;
    use crate::store::BoxFuture;

    pub trait Sealed: sqlx::Database {
        /// How the database quotes an identifier.
        const QUOTE: char;
        /// The first parameter's placeholder.
        const PARAM: &'static str;
        /// The type a state is cast to when read.
        const TEXT: &'static str;
        /// What locks the row on the classifying read.
        const LOCK: &'static str;

        /// Runs a guarded `UPDATE` with the id bound; the rows it changed.
        fn update<'c, I>(
            conn: &'c mut Self::Connection,
            sql: &'c str,
            id: &'c I,
        ) -> BoxFuture<'c, Result<u64, Error>>
        where
            I: for<'q> Encode<'q, Self> + Type<Self> + Sync;

        /// Reads the row's state: `None` without a row, `Some(None)` for `NULL`.
        fn read<'c, I>(
            conn: &'c mut Self::Connection,
            sql: &'c str,
            id: &'c I,
        ) -> BoxFuture<'c, Result<Option<Option<String>>, Error>>
        where
            I: for<'q> Encode<'q, Self> + Type<Self> + Sync;
    }
}

/// A database a [`StateColumn`] runs on: `sqlx::Postgres`, `sqlx::MySql` or
/// `sqlx::Sqlite` (with the features `postgres`, `mysql`, `sqlite`). Sealed: what idem
/// does with it is internal.
pub trait StateDatabase: sqlx::Database + sealed::Sealed {}

macro_rules! state_database {
    ($feature:literal, $db:ty, quote = $quote:literal, param = $param:literal,
     text = $text:literal, lock = $lock:literal) => {
        #[cfg(feature = $feature)]
        impl StateDatabase for $db {}

        #[cfg(feature = $feature)]
        impl sealed::Sealed for $db {
            const QUOTE: char = $quote;
            const PARAM: &'static str = $param;
            const TEXT: &'static str = $text;
            const LOCK: &'static str = $lock;

            fn update<'c, I>(
                conn: &'c mut Self::Connection,
                sql: &'c str,
                id: &'c I,
            ) -> BoxFuture<'c, Result<u64, Error>>
            where
                I: for<'q> Encode<'q, Self> + Type<Self> + Sync,
            {
                Box::pin(async move {
                    sqlx::query(sqlx::AssertSqlSafe(sql))
                        .bind(id)
                        .execute(&mut *conn)
                        .await
                        .map(|done| done.rows_affected())
                        .map_err(Error::store)
                })
            }

            fn read<'c, I>(
                conn: &'c mut Self::Connection,
                sql: &'c str,
                id: &'c I,
            ) -> BoxFuture<'c, Result<Option<Option<String>>, Error>>
            where
                I: for<'q> Encode<'q, Self> + Type<Self> + Sync,
            {
                Box::pin(async move {
                    let row: Option<(Option<String>,)> = sqlx::query_as(sqlx::AssertSqlSafe(sql))
                        .bind(id)
                        .fetch_optional(&mut *conn)
                        .await
                        .map_err(Error::store)?;
                    Ok(row.map(|(state,)| state))
                })
            }
        }
    };
}

// PostgreSQL and MySQL lock the row on the classifying read: a plain read inside a
// transaction may see an older snapshot than the `UPDATE` did. SQLite has no row locks,
// and a transaction that wrote holds the database's only write lock anyway.
state_database!(
    "postgres",
    sqlx::Postgres,
    quote = '"',
    param = "$1",
    text = "TEXT",
    lock = " FOR UPDATE"
);
state_database!(
    "mysql",
    sqlx::MySql,
    quote = '`',
    param = "?",
    text = "CHAR",
    lock = " FOR UPDATE"
);
state_database!(
    "sqlite",
    sqlx::Sqlite,
    quote = '"',
    param = "?",
    text = "TEXT",
    lock = ""
);

#[cfg(test)]
mod tests {
    use super::*;

    fn machine() -> StateMachine {
        StateMachine::builder("t")
            .states(["new", "open", "done"])
            .initial("new")
            .allow("new", ["open"])
            .allow("open", ["done"])
            .terminal(["done"])
            .build()
            .unwrap()
    }

    #[test]
    fn names_are_checked_before_any_sql() {
        let m = machine();
        assert!(m.stored_in("orders", "id", "status").is_ok());
        assert!(m.stored_in("shop.orders", "order_id", "_state2").is_ok());
        for (t, i, c) in [
            ("orders\"; DROP TABLE x; --", "id", "status"),
            ("a.b.c", "id", "status"),
            ("orders", "1d", "status"),
            ("orders", "id", "sta tus"),
            ("orders", "id", ""),
            ("", "id", "status"),
            ("orders.", "id", "status"),
            ("orders", "id", "stätus"),
            ("orders", "id", "st`atus"),
        ] {
            let r = m.stored_in(t, i, c);
            assert!(
                matches!(r, Err(Error::Config(_))),
                "{t:?} {i:?} {c:?}: {r:?}"
            );
        }
        let long = "x".repeat(64);
        assert!(matches!(
            m.stored_in(&long, "id", "s"),
            Err(Error::Config(_))
        ));
        let quoted = StateMachine::builder("q")
            .states(["it's"])
            .initial("it's")
            .build()
            .unwrap();
        let msg = quoted.stored_in("t", "id", "s").unwrap_err().to_string();
        assert!(msg.contains("quote"), "{msg}");
    }

    #[cfg(feature = "postgres")]
    #[test]
    fn plan_guards_each_source_and_reads_with_a_lock() {
        let col = machine().stored_in("shop.orders", "id", "status").unwrap();
        let plan = col.plan::<sqlx::Postgres>("new").unwrap();
        assert_eq!(plan.moves.len(), 1);
        assert_eq!(
            plan.moves[0].1,
            r#"UPDATE "shop"."orders" SET "status" = 'new' WHERE "id" = $1 AND "status" IS NULL"#
        );
        let plan = col.plan::<sqlx::Postgres>("open").unwrap();
        assert_eq!(
            plan.moves,
            vec![(
                Some("new"),
                r#"UPDATE "shop"."orders" SET "status" = 'open' WHERE "id" = $1 AND "status" = 'new'"#
                    .to_owned()
            )]
        );
        assert_eq!(
            plan.read,
            r#"SELECT CAST("status" AS TEXT) FROM "shop"."orders" WHERE "id" = $1 FOR UPDATE"#
        );
        assert!(matches!(
            col.plan::<sqlx::Postgres>("open'; --"),
            Err(Error::Config(_))
        ));
    }
}
