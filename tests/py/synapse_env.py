"""A throwaway Synapse homeserver for tests/tests/matrix.rs (PyPI `matrix-synapse`,
pinned in tests/requirements.txt).

    python synapse_env.py DIR PORT SHARED_SECRET

Writes DIR/homeserver.yaml and its log config (server_name `localhost`; one client
listener on 127.0.0.1:PORT, no federation listener; SQLite; registration only by the
shared secret; presence, metrics, URL previews, key servers and default encryption
off; every rate limit high — a test lowers one user's rc_message with the admin API),
generates the signing key, starts Synapse and prints `ready` once it answers
/_matrix/client/versions. Synapse's access log goes to DIR/access.log ("Processed
request" lines: port, user, status, method, URI without the token). Synapse stops when
this script's stdin closes (the test process ended) or on SIGTERM, and DIR is
removed.
"""

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

directory, port, secret = sys.argv[1], int(sys.argv[2]), sys.argv[3]
os.makedirs(directory, exist_ok=True)
high = "{per_second: 1000, burst_count: 1000}"
config = f"""
server_name: localhost
pid_file: {directory}/homeserver.pid
public_baseurl: http://127.0.0.1:{port}/
listeners:
  - port: {port}
    bind_addresses: ['127.0.0.1']
    type: http
    tls: false
    x_forwarded: false
    resources:
      - names: [client]
        compress: false
database:
  name: sqlite3
  args:
    database: {directory}/homeserver.db
log_config: {directory}/log.yaml
media_store_path: {directory}/media
signing_key_path: {directory}/signing.key
registration_shared_secret: "{secret}"
enable_registration: false
report_stats: false
presence:
  enabled: false
enable_metrics: false
url_preview_enabled: false
trusted_key_servers: []
suppress_key_server_warning: true
encryption_enabled_by_default_for_room_type: "off"
federation_domain_whitelist: []
rc_message: {high}
rc_registration: {high}
rc_joins:
  local: {high}
  remote: {high}
rc_joins_per_room: {high}
rc_invites:
  per_room: {high}
  per_user: {high}
  per_issuer: {high}
rc_login:
  address: {high}
  account: {high}
  failed_attempts: {high}
rc_admin_redaction: {high}
rc_3pid_validation: {high}
rc_presence:
  per_user: {high}
rc_delayed_event_mgmt: {high}
rc_room_creation: {high}
"""
log = f"""
version: 1
formatters:
  precise:
    format: '%(asctime)s - %(name)s - %(lineno)d - %(levelname)s - %(request)s - %(message)s'
handlers:
  file:
    class: logging.FileHandler
    formatter: precise
    filename: {directory}/homeserver.log
  access:
    class: logging.FileHandler
    formatter: precise
    filename: {directory}/access.log
loggers:
  synapse.access:
    level: INFO
    handlers: [access]
    propagate: false
root:
  level: WARNING
  handlers: [file]
disable_existing_loggers: false
"""
with open(f"{directory}/homeserver.yaml", "w") as f:
    f.write(config)
with open(f"{directory}/log.yaml", "w") as f:
    f.write(log)

subprocess.run(
    [sys.executable, "-m", "synapse.app.homeserver", "-c", f"{directory}/homeserver.yaml", "--generate-keys"],
    check=True,
    stdout=subprocess.DEVNULL,
)
server = subprocess.Popen(
    [sys.executable, "-m", "synapse.app.homeserver", "-c", f"{directory}/homeserver.yaml"],
    stdout=open(f"{directory}/stdout.log", "w"),
    stderr=subprocess.STDOUT,
)


def stop(*_):
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(directory, ignore_errors=True)
    os._exit(0)


signal.signal(signal.SIGTERM, stop)
deadline = time.time() + 60
while True:
    if server.poll() is not None:
        print(f"synapse exited with {server.returncode}", flush=True)
        sys.exit(1)
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/_matrix/client/versions", timeout=1)
        break
    except Exception:
        if time.time() > deadline:
            print("synapse did not answer in 60 s", flush=True)
            stop()
        time.sleep(0.1)
print("ready", flush=True)
sys.stdin.read()
stop()
