"""Sign-in with the lab's directory: LDAP (django-auth-ldap) and OpenID Connect (mozilla-django-oidc).

Both are optional and configured from the environment (``config``, read by gpuadmin/settings.py);
local accounts keep working beside them. A directory person's roles are the directory's groups
(``roles``), set again at every sign-in, so a group removed there is a role removed here at the
next sign-in (or the next ``manage.py sync_people``). docs/deploy.md, "Signing in with the lab's
directory".
"""
