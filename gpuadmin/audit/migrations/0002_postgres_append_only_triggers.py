"""On PostgreSQL, refuse UPDATE, DELETE and TRUNCATE of audit events below the ORM.

The one update let through is the one Django makes when a user is deleted:
clearing ``actor_id`` and nothing else (``actor_name`` keeps who it was and the
hash never covered the foreign key). Other databases get nothing here; the
model refuses changes there, and ``verify_audit`` finds edits made behind its back.

These triggers stop accidents and casual edits, not the table's owner or a
superuser, who can disable them; ``verify_audit`` is what catches that.
"""

from django.db import migrations

FUNCTION = "gpuadmin_audit_refuse_change"

INSTALL = """
CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        -- Deleting a user sets actor_id to NULL (on_delete=SET_NULL); allow exactly that.
        IF NEW.actor_id IS NULL AND (to_jsonb(NEW) - 'actor_id') = (to_jsonb(OLD) - 'actor_id') THEN
            RETURN NEW;
        END IF;
    END IF;
    RAISE EXCEPTION 'audit events are append-only: % on % is refused', TG_OP, TG_TABLE_NAME
        USING HINT = 'Audit events are never changed or removed; only clearing actor_id of a deleted user is allowed.';
END;
$$;
CREATE TRIGGER {table}_refuse_update BEFORE UPDATE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
CREATE TRIGGER {table}_refuse_delete BEFORE DELETE ON {table}
    FOR EACH ROW EXECUTE FUNCTION {function}();
CREATE TRIGGER {table}_refuse_truncate BEFORE TRUNCATE ON {table}
    FOR EACH STATEMENT EXECUTE FUNCTION {function}();
"""

UNINSTALL = """
DROP TRIGGER IF EXISTS {table}_refuse_update ON {table};
DROP TRIGGER IF EXISTS {table}_refuse_delete ON {table};
DROP TRIGGER IF EXISTS {table}_refuse_truncate ON {table};
DROP FUNCTION IF EXISTS {function}();
"""


def _run(sql_template, apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    table = apps.get_model("audit", "AuditEvent")._meta.db_table
    schema_editor.execute(sql_template.format(table=table, function=FUNCTION), params=None)


def install(apps, schema_editor):
    _run(INSTALL, apps, schema_editor)


def uninstall(apps, schema_editor):
    _run(UNINSTALL, apps, schema_editor)


class Migration(migrations.Migration):
    dependencies = [("audit", "0001_initial")]
    operations = [migrations.RunPython(install, uninstall)]
