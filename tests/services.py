"""Throwaway servers for tests: redis-server, PostgreSQL and slapd, each on a free port in a temp dir.

Used by tests/conftest.py (fixtures) and tests/with_postgres.py (a whole run on
PostgreSQL). A missing binary raises ServiceMissing with the reason; the caller
decides whether that skips or fails (GPUADMIN_REQUIRE_SERVICES=1: fail). A
server that is there but does not start raises ServiceFailed: always a failure.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0
# Debian's postgresql package keeps its binaries off PATH.
POSTGRES_BIN_GLOB = "/usr/lib/postgresql/*/bin"


class ServiceMissing(RuntimeError):
    """A server a test needs is not installed here; the message says what to install."""


class ServiceFailed(RuntimeError):
    """A server is installed but did not start; always an error, never a skip."""


def services_required() -> bool:
    return os.environ.get("GPUADMIN_REQUIRE_SERVICES") == "1"


def missing(reason: str) -> None:
    """A server a test needs cannot start: skip the test, or fail it under GPUADMIN_REQUIRE_SERVICES=1."""
    import pytest

    if services_required():
        pytest.fail(f"{reason} (GPUADMIN_REQUIRE_SERVICES=1)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def find_binary(name: str, extra_dirs: list[str] | None = None) -> str:
    found = shutil.which(name)
    if found:
        return found
    for directory in sorted(extra_dirs or [], reverse=True):  # the newest version first
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    raise ServiceMissing(f"{name} not found on PATH (Debian: apt-get install {_debian_package(name)})")


def _debian_package(binary: str) -> str:
    return {"redis-server": "redis-server", "runuser": "util-linux", "slapd": "slapd", "slapadd": "slapd",
            "node": "nodejs", "npm": "npm"}.get(binary, "postgresql")


def wait_for_port(port: int, process: subprocess.Popen, what: str, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise ServiceFailed(f"{what} exited with status {process.returncode}: {_tail(log_path)}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return
        time.sleep(0.05)
    raise ServiceFailed(f"{what} did not listen on port {port} within {START_TIMEOUT_SECONDS:.0f} s")


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def stop_process_group(process: subprocess.Popen, timeout_seconds: float = STOP_TIMEOUT_SECONDS) -> None:
    """SIGTERM the process group a test started (start_new_session=True), SIGKILL it if it lingers."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout_seconds)
    # Whatever is left of the group (the leader may be gone, its children not).
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# --- redis-server --------------------------------------------------------------


@dataclass
class RedisServer:
    port: int
    process: subprocess.Popen
    directory: Path
    password: str = ""
    ca_file: Path | None = None  # set when the server speaks TLS only, with a certificate this CA signed
    argv: tuple[str, ...] = ()

    @property
    def url(self) -> str:
        """The broker URL as a lab writes it: rediss:// with the CA to verify against when TLS."""
        credentials = f":{self.password}@" if self.password else ""
        if self.ca_file is None:
            return f"redis://{credentials}127.0.0.1:{self.port}/0"
        return (f"rediss://{credentials}localhost:{self.port}/0"
                f"?ssl_cert_reqs=required&ssl_ca_certs={self.ca_file}")

    def stop(self) -> None:
        """Stop the server (a fault test's outage); ``start_again`` brings it back on the same port."""
        stop_process_group(self.process)

    def start_again(self) -> None:
        """Start redis-server again on its port, empty: it keeps nothing on disk (--save "")."""
        self.process = subprocess.Popen(list(self.argv), stdin=subprocess.DEVNULL, start_new_session=True)
        wait_for_port(self.port, self.process, "redis-server", self.directory / "redis.log")


@contextlib.contextmanager
def redis_server(password: str = "", *, tls: bool = False) -> Iterator[RedisServer]:
    """A throwaway redis-server; with ``password``, clients must AUTH (the URL carries it); with
    ``tls``, it listens for TLS only, its certificate (for localhost) signed by a CA made here."""
    binary = find_binary("redis-server")
    directory = Path(tempfile.mkdtemp(prefix="gpuadmin-redis-"))
    port = free_port()
    log_path = directory / "redis.log"
    ca_file = None
    if tls:
        ca_file, cert_file, key_file = make_tls_files(directory, "localhost")
        listen = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert_file),
                  "--tls-key-file", str(key_file), "--tls-ca-cert-file", str(ca_file),
                  "--tls-auth-clients", "no"]
    else:
        listen = ["--port", str(port)]
    argv = [
        binary, *listen, "--bind", "127.0.0.1", "--dir", str(directory),
        "--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", str(log_path),
        *(["--requirepass", password] if password else []),
    ]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    server: RedisServer | None = None
    try:
        wait_for_port(port, process, "redis-server", log_path)
        server = RedisServer(port=port, process=process, directory=directory, password=password,
                             ca_file=ca_file, argv=tuple(argv))
        yield server
    finally:
        stop_process_group(server.process if server else process)
        shutil.rmtree(directory, ignore_errors=True)


def make_tls_files(directory: Path, host_name: str) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for ``host_name`` (and 127.0.0.1) it signed:
    the paths of the CA's certificate, the server's certificate and its key (PEM)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid_from, valid_until = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpuadmin test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(valid_from).not_valid_after(valid_until)
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False,
                                       data_encipherment=False, key_agreement=False,
                                       encipher_only=False, decipher_only=False),
                         critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    server_key = ec.generate_private_key(ec.SECP256R1())
    server = (x509.CertificateBuilder()
              .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host_name)]))
              .issuer_name(ca_name).public_key(server_key.public_key()).serial_number(x509.random_serial_number())
              .not_valid_before(valid_from).not_valid_after(valid_until)
              .add_extension(x509.SubjectAlternativeName([
                  x509.DNSName(host_name), x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
              ]), critical=False)
              .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
              .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]),
                             critical=False)
              .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                             critical=False)
              .sign(ca_key, hashes.SHA256()))
    paths = directory / "ca.pem", directory / "server.pem", directory / "server-key.pem"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(server_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    paths[2].chmod(0o600)
    return paths


# --- PostgreSQL ----------------------------------------------------------------


@dataclass
class PostgresServer:
    port: int
    user: str
    socket_dir: Path
    database: str = "gpuadmin"

    @property
    def url(self) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{self.database}"

    @property
    def socket_url(self) -> str:
        """The same server over its Unix socket (the directory as the host, percent-encoded)."""
        return f"postgresql://{self.user}@{quote(str(self.socket_dir), safe='')}:{self.port}/{self.database}"


def _postgres_os_user() -> tuple[str, list[str]]:
    """PostgreSQL refuses to run as root: as root, run it as the `postgres` system user."""
    if os.geteuid() != 0:
        return pwd.getpwuid(os.geteuid()).pw_name, []
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        raise ServiceMissing("running as root and there is no `postgres` user to run PostgreSQL as") from None
    return "postgres", [find_binary("runuser"), "-u", "postgres", "--"]


@contextlib.contextmanager
def _cluster(prefix: str, create: Callable[[Path], None], options: str, what: str
             ) -> Iterator[tuple[int, Path]]:
    """A PostgreSQL cluster in a fresh folder the server's user owns (not under pytest's tmp dirs: those
    are private to root, and the server runs as `postgres`): ``create`` makes its data folder (initdb,
    pg_basebackup), then it starts on a free port, on loopback, with ``options`` added. Yields its port
    and socket folder; stopped and removed whatever happens."""
    pg_ctl = find_binary("pg_ctl", glob.glob(POSTGRES_BIN_GLOB))
    os_user, as_user = _postgres_os_user()
    directory = Path(tempfile.mkdtemp(prefix=prefix))
    data_dir, socket_dir, log_path = directory / "data", directory / "sockets", directory / "server.log"
    socket_dir.mkdir()
    if as_user:
        for path in (directory, socket_dir):
            shutil.chown(path, user=os_user)
    port = free_port()
    started = False
    try:
        create(data_dir)
        _run([*as_user, pg_ctl, "-D", str(data_dir), "-l", str(log_path), "-o",
              f"-p {port} -k {socket_dir} -c listen_addresses=127.0.0.1 {options}", "-w",
              "-t", str(int(START_TIMEOUT_SECONDS)), "start"], what, log_path)
        started = True
        yield port, socket_dir
    finally:
        if started:
            subprocess.run([*as_user, pg_ctl, "-D", str(data_dir), "-m", "immediate", "-w", "stop"],
                           stdin=subprocess.DEVNULL, capture_output=True, check=False)
        shutil.rmtree(directory, ignore_errors=True)


@contextlib.contextmanager
def postgres_server(settings: Sequence[str] = ()) -> Iterator[PostgresServer]:
    """A throwaway server; ``settings``: more ``name=value`` for it (a benchmark's extension)."""
    bin_dirs = glob.glob(POSTGRES_BIN_GLOB)
    initdb = find_binary("initdb", bin_dirs)
    os_user, as_user = _postgres_os_user()

    def create(data_dir: Path) -> None:
        _run([*as_user, initdb, "-D", str(data_dir), "-U", os_user, "--auth=trust",
              "--encoding=UTF8", "--no-locale", "--no-sync"], "initdb")

    options = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off" + "".join(
        f" -c {v}" for v in settings)
    with _cluster("gpuadmin-postgres-", create, options, "pg_ctl start") as (port, socket_dir):
        server = PostgresServer(port=port, user=os_user, socket_dir=socket_dir)
        _run([*as_user, find_binary("createdb", bin_dirs), "-h", "127.0.0.1", "-p", str(port),
              "-U", os_user, server.database], "createdb")
        yield server


@contextlib.contextmanager
def postgres_with_standby() -> Iterator[tuple[PostgresServer, PostgresServer]]:
    """A throwaway primary and a hot standby streaming from it (pg_basebackup -R), on two free ports.

    The standby answers reads only and lags the primary by its replay. Both are stopped and removed
    whatever happens.
    """
    pg_basebackup = find_binary("pg_basebackup", glob.glob(POSTGRES_BIN_GLOB))
    os_user, as_user = _postgres_os_user()
    with postgres_server(["wal_level=replica", "max_wal_senders=4"]) as primary:

        def create(data_dir: Path) -> None:
            # -R writes standby.signal and primary_conninfo: the copy starts as a standby of the primary.
            _run([*as_user, pg_basebackup, "-h", "127.0.0.1", "-p", str(primary.port), "-U", os_user,
                  "-D", str(data_dir), "-R", "-X", "stream", "--no-sync", "--checkpoint=fast"],
                 "pg_basebackup")

        with _cluster("gpuadmin-postgres-standby-", create, "-c hot_standby=on",
                      "pg_ctl start (standby)") as (port, socket_dir):
            yield primary, PostgresServer(port=port, user=os_user, socket_dir=socket_dir)


def _run(argv: list[str], what: str, log_path: Path | None = None) -> None:
    result = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        if log_path is not None:
            detail += "\n" + _tail(log_path)
        raise ServiceFailed(f"{what} failed with status {result.returncode}: {detail}")


# --- slapd (OpenLDAP) ------------------------------------------------------------

SLAPD_SCHEMA_DIR = "/etc/ldap/schema"
SLAPD_MODULE_DIR = "/usr/lib/ldap"
LDAP_SUFFIX = "dc=lab,dc=example"


@dataclass
class SlapdServer:
    """One slapd with plain LDAP (StartTLS offered) on ``port`` and LDAPS on ``ldaps_port``, its
    certificate (for localhost and 127.0.0.1) signed by the CA at ``ca_file``."""

    port: int
    ldaps_port: int
    directory: Path
    ca_file: Path
    root_dn: str
    root_password: str
    suffix: str = LDAP_SUFFIX

    @property
    def url(self) -> str:
        return f"ldap://127.0.0.1:{self.port}"

    @property
    def ldaps_url(self) -> str:
        return f"ldaps://127.0.0.1:{self.ldaps_port}"


@contextlib.contextmanager
def slapd_server(ldif: str = "") -> Iterator[SlapdServer]:
    """A throwaway OpenLDAP server (mdb database under a temp dir) holding ``ldif``, loaded by slapadd
    before it starts; its root account (``root_dn``/``root_password``) may change entries."""
    slapd = find_binary("slapd", ["/usr/sbin"])
    slapadd = find_binary("slapadd", ["/usr/sbin"])
    if not (Path(SLAPD_MODULE_DIR, "back_mdb.so").exists() and Path(SLAPD_SCHEMA_DIR, "nis.schema").exists()):
        raise ServiceMissing(f"slapd's modules or schema are missing under {SLAPD_MODULE_DIR}, "
                             f"{SLAPD_SCHEMA_DIR} (Debian: apt-get install slapd)")
    directory = Path(tempfile.mkdtemp(prefix="gpuadmin-slapd-"))
    (directory / "db").mkdir()
    ca_file, cert_file, key_file = make_tls_files(directory, "localhost")
    root_dn, root_password = f"cn=admin,{LDAP_SUFFIX}", "root-secret"
    config = directory / "slapd.conf"
    schemas = "".join(f"include {SLAPD_SCHEMA_DIR}/{name}.schema\n"
                      for name in ("core", "cosine", "nis", "inetorgperson"))
    config.write_text(
        f"{schemas}modulepath {SLAPD_MODULE_DIR}\nmoduleload back_mdb\n"
        f"pidfile {directory}/slapd.pid\n"
        f"TLSCACertificateFile {ca_file}\nTLSCertificateFile {cert_file}\nTLSCertificateKeyFile {key_file}\n"
        # Passwords are readable by their owner only (to bind), and nobody else.
        "access to attrs=userPassword by self auth by anonymous auth by * none\n"
        "access to * by * read\n"
        f"database mdb\nsuffix \"{LDAP_SUFFIX}\"\nrootdn \"{root_dn}\"\nrootpw {root_password}\n"
        f"directory {directory}/db\nmaxsize 16777216\n"
    )
    base = f"dn: {LDAP_SUFFIX}\nobjectClass: dcObject\nobjectClass: organization\no: Lab\ndc: lab\n\n"
    (directory / "data.ldif").write_text(base + ldif)
    _run([slapadd, "-f", str(config), "-l", str(directory / "data.ldif")], "slapadd")
    port, ldaps_port = free_port(), free_port()
    log_path = directory / "slapd.log"
    with log_path.open("wb") as log:
        # -d 0: stay in the foreground (a process group the tests own) and log nothing but errors.
        process = subprocess.Popen(
            [slapd, "-f", str(config), "-h", f"ldap://127.0.0.1:{port}/ ldaps://127.0.0.1:{ldaps_port}/",
             "-d", "0"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, process, "slapd", log_path)
        wait_for_port(ldaps_port, process, "slapd", log_path)
        yield SlapdServer(port=port, ldaps_port=ldaps_port, directory=directory, ca_file=ca_file,
                          root_dn=root_dn, root_password=root_password)
    finally:
        stop_process_group(process)
        shutil.rmtree(directory, ignore_errors=True)


# --- an OpenID Connect provider (node, oidc-provider) ---------------------------------

OIDC_PROVIDER_DIR = Path(__file__).resolve().parent / "accounts" / "oidc_provider"


@dataclass
class OidcProvider:
    """tests/accounts/oidc_provider/provider.js on ``port``: its one client, and its people in
    ``accounts_file`` (read at each request: ``set_people`` changes them at once)."""

    port: int
    client_id: str
    client_secret: str
    accounts_file: Path

    @property
    def issuer(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def set_people(self, people: dict[str, dict]) -> None:
        import json

        self.accounts_file.write_text(json.dumps(people))

    def environment(self) -> dict[str, str]:
        """GPUADMIN_OIDC_* as a lab writes them for this provider (its discovery document's endpoints)."""
        return {
            "GPUADMIN_OIDC_CLIENT_ID": self.client_id, "GPUADMIN_OIDC_CLIENT_SECRET": self.client_secret,
            "GPUADMIN_OIDC_ISSUER": self.issuer,
            "GPUADMIN_OIDC_AUTHORIZATION_ENDPOINT": f"{self.issuer}/auth",
            "GPUADMIN_OIDC_TOKEN_ENDPOINT": f"{self.issuer}/token",
            "GPUADMIN_OIDC_USERINFO_ENDPOINT": f"{self.issuer}/me",
            "GPUADMIN_OIDC_JWKS_ENDPOINT": f"{self.issuer}/jwks",
            "GPUADMIN_OIDC_PROVIDER_NAME": "Test provider",
        }


def _npm_installed(directory: Path) -> None:
    """node_modules from the lockfile (npm ci), once, even with several test workers at it."""
    import fcntl

    if (directory / "node_modules" / "oidc-provider" / "package.json").exists():
        return
    npm = find_binary("npm")
    with (Path(tempfile.gettempdir()) / "gpuadmin-oidc-provider-npm.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / "node_modules" / "oidc-provider" / "package.json").exists():
            _run([npm, "ci", "--no-audit", "--no-fund", "--prefer-offline", "--prefix", str(directory)],
                 "npm ci")


@contextlib.contextmanager
def oidc_provider(people: dict[str, dict]) -> Iterator[OidcProvider]:
    """The test provider on a free loopback port, with ``people`` ({name: {password, email, groups}})."""
    node = find_binary("node")
    _npm_installed(OIDC_PROVIDER_DIR)
    directory = Path(tempfile.mkdtemp(prefix="gpuadmin-oidc-"))
    port = free_port()
    provider = OidcProvider(port=port, client_id="gpuadmin", client_secret="test-client-secret",
                            accounts_file=directory / "accounts.json")
    provider.set_people(people)
    log_path = directory / "provider.log"
    env = {**os.environ, "PORT": str(port), "CLIENT_ID": provider.client_id,
           "CLIENT_SECRET": provider.client_secret, "ACCOUNTS_FILE": str(provider.accounts_file)}
    with log_path.open("wb") as log:
        process = subprocess.Popen([node, str(OIDC_PROVIDER_DIR / "provider.js")], env=env,
                                   cwd=OIDC_PROVIDER_DIR, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for_port(port, process, "the OpenID Connect provider (node)", log_path)
        yield provider
    finally:
        stop_process_group(process)
        shutil.rmtree(directory, ignore_errors=True)
