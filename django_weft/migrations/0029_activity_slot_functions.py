"""Two PL/pgSQL functions that decide an activity concurrency slot in one round trip
when nobody waits for one, on PostgreSQL only (docs/explanation/flow-control.md,
"Activity slots"). SQLite and every contended case keep the store's Python path.

Each takes the group's transaction-scoped advisory lock and then reads: a function's
statements each take a new snapshot, so they see every decision committed before the
lock was granted (a single SQL statement would read with a snapshot taken before it).

``weft_take_free_slot`` inserts a held slot for the attempt when it has no row of its
own, nobody waits in its group and a slot is free, returning how many are then in use;
else ``NULL``, and the caller decides under the lock as before.
``weft_give_slot_back`` deletes the execution's row and says whether anybody waits in
the group (the caller then hands the free slots on); ``p_unhurried`` (a call in a
transaction of its own) commits it without waiting for the WAL flush: a slot given back
that a crash of the database forgets comes free when its lease runs out.
"""

from __future__ import annotations

from django.db import migrations

TAKE = """
CREATE OR REPLACE FUNCTION weft_take_free_slot(
    p_group text, p_space integer, p_activity text, p_key text, p_limit integer,
    p_run uuid, p_seq integer, p_ttl double precision, p_holder text, p_now timestamptz
) RETURNS integer LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    v_now timestamptz;
    v_in_use integer;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(p_group, p_space));
    v_now := COALESCE(p_now, clock_timestamp());
    IF EXISTS (SELECT 1 FROM {table} WHERE run_id = p_run AND seq = p_seq)
       OR EXISTS (SELECT 1 FROM {table} WHERE activity = p_activity AND "key" = p_key AND state = 'waiting')
    THEN
        RETURN NULL;
    END IF;
    SELECT count(*) INTO v_in_use FROM {table}
     WHERE activity = p_activity AND "key" = p_key AND state = 'held' AND lease_expires_at > v_now;
    IF v_in_use >= p_limit THEN
        RETURN NULL;
    END IF;
    INSERT INTO {table} (activity, "key", run_id, seq, state, holder, lease_expires_at, created_at)
    VALUES (p_activity, p_key, p_run, p_seq, 'held', p_holder, v_now + p_ttl * interval '1 second', v_now);
    RETURN v_in_use + 1;
END
$$
"""

GIVE_BACK = """
CREATE OR REPLACE FUNCTION weft_give_slot_back(
    p_group text, p_space integer, p_activity text, p_key text, p_run uuid, p_seq integer, p_holder text,
    p_unhurried boolean
) RETURNS boolean LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    IF p_unhurried THEN
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_group, p_space));
    DELETE FROM {table} WHERE run_id = p_run AND seq = p_seq AND holder = p_holder;
    RETURN EXISTS (SELECT 1 FROM {table} WHERE activity = p_activity AND "key" = p_key AND state = 'waiting');
END
$$
"""


def create_functions(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        table = schema_editor.quote_name(apps.get_model("django_weft", "ActivitySlot")._meta.db_table)
        schema_editor.execute(TAKE.format(table=table))
        schema_editor.execute(GIVE_BACK.format(table=table))


def drop_functions(apps, schema_editor):  # type: ignore[no-untyped-def]
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS weft_take_free_slot(text, integer, text, text, integer, uuid, integer, "
            "double precision, text, timestamptz)"
        )
        schema_editor.execute(
            "DROP FUNCTION IF EXISTS weft_give_slot_back(text, integer, text, text, uuid, integer, text, "
            "boolean)"
        )


class Migration(migrations.Migration):
    dependencies = [("django_weft", "0028_activity_slot_holder")]
    operations = [
        # The hint lets a router that places the activity slot table place its functions.
        migrations.RunPython(
            create_functions, drop_functions, elidable=False, hints={"model_name": "activityslot"}
        )
    ]
