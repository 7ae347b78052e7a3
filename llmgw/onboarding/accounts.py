"""The account the daemon logs in as on a node (``cluster.ssh.user``), made by ``node add``.

``node add`` logs in as the user it is given (root, or one with sudo); the
daemon, ``inventory`` and ``doctor`` log in as ``cluster.ssh.user``. When the
two differ, this step makes sure that account exists on the node and accepts
the control host's key, so that a ``node add`` that succeeds proves the daemon
can reach the node:

* missing: a system account (``useradd --system``), primary group ``llmgw``
  (the group of the agent's socket), no password (``*``: none, yet not
  locked), shell ``/usr/sbin/nologin`` (the daemon only forwards the agent's
  socket; see docs/security.md), home
  ``/home/USER``. Not under the prefix: ``node add``'s install takes the prefix
  over with ``chown -R`` and ``node remove --uninstall`` deletes it, and the
  key must stay owned by the account; the account's lifetime is ``userdel -r``'s.
* present: added to the ``llmgw`` group when it is not in it.
* the public half of the key ``node add`` logged in with is appended to its
  ``~/.ssh/authorized_keys`` as ``restrict,port-forwarding,command="internal-sftp"``
  unless that line is already there (the same key with other options is
  replaced); the file is made 0600 and the account's. ``internal-sftp`` is
  sshd's own SFTP server, which needs no shell: every session of the key is
  SFTP (``llmgw engine install`` ships binaries with it; a stock sshd's
  ``Subsystem sftp /usr/lib/openssh/sftp-server`` runs through the
  account's shell, which ``nologin`` refuses), and no command runs.

``cluster.ssh.user: root`` means the daemon logs in as root: no account is
made and root's keys are left alone. Every check runs before the first
change; a second run changes nothing.
"""

from __future__ import annotations

import base64
import re
import shlex
from dataclasses import dataclass

import asyncssh

GROUP = "llmgw"
# Forwarding the agent's socket, and SFTP without a shell; nothing else.
KEY_OPTIONS = 'restrict,port-forwarding,command="internal-sftp"'
USER_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")

# Run as root (or under `sudo -n`); $1 the account, $2 the key's type and base64 blob,
# $3 the authorized_keys line. Prints what it found and what it did, one key=value a line.
SCRIPT = r"""
set -e
u=$1 blob=$2 line=$3
if ! id -u "$u" >/dev/null 2>&1; then
  for tool in useradd groupadd; do
    command -v $tool >/dev/null 2>&1 || { echo "missing=$tool"; exit 3; }
  done
fi
getent group llmgw >/dev/null || { groupadd --system llmgw; echo group=created; }
if id -u "$u" >/dev/null 2>&1; then
  if id -nG "$u" | tr ' ' '\n' | grep -qx llmgw; then echo member=yes
  else usermod -a -G llmgw "$u"; echo member=added; fi
else
  # '*': no password, yet not locked ('!'), which sshd without PAM refuses.
  useradd --system --gid llmgw --password '*' --create-home --home-dir "/home/$u" \
    --shell /usr/sbin/nologin --comment "llmgw daemon (node add)" "$u"
  echo user=created
fi
home=$(getent passwd "$u" | cut -d: -f6)
gid=$(id -g "$u")
[ -d "$home" ] || { mkdir -p "$home"; chown "$u:$gid" "$home"; chmod 0750 "$home"; }
install -d -m 0700 -o "$u" -g "$gid" "$home/.ssh"
keys="$home/.ssh/authorized_keys"
touch "$keys"
if grep -qxF -- "$line" "$keys"; then echo key=present
elif grep -qF -- "$blob" "$keys"; then
  # our key with other options (an older node add's): its line replaced
  { grep -vF -- "$blob" "$keys" || true; printf '%s\n' "$line"; } > "$keys.llmgw-new"
  mv "$keys.llmgw-new" "$keys"; echo key=updated
else printf '%s\n' "$line" >> "$keys"; echo key=added; fi
chown "$u:$gid" "$keys"; chmod 0600 "$keys"
echo home=$home
"""


class AccountError(Exception):
    """The account cannot be made; nothing was changed on the node."""


@dataclass(frozen=True)
class Outcome:
    """What the step found and did."""

    user: str
    changes: list[str]
    home: str

    def detail(self) -> str:
        if not self.changes:
            return f"{self.user} exists, in group {GROUP}, our key authorized: unchanged"
        return f"{self.user}: {', '.join(self.changes)} ({self.home}/.ssh/authorized_keys)"


def public_line(key: asyncssh.SSHKeyPair) -> tuple[str, str]:
    """The key's ``TYPE BASE64`` (what identifies it in authorized_keys) and the line to add."""
    data = key.public_data  # SSH wire format: the key type's name comes first
    kind = data[4:4 + int.from_bytes(data[:4], "big")].decode("ascii")
    blob = f"{kind} {base64.b64encode(data).decode('ascii')}"
    return blob, f'{KEY_OPTIONS} {blob} llmgw-daemon'


async def ensure(conn: asyncssh.SSHClientConnection, user: str, sudo: bool,
                 key: asyncssh.SSHKeyPair) -> Outcome:
    """Make ``user`` exist in group ``llmgw`` and accept ``key`` (see the module)."""
    if not USER_NAME.match(user):
        raise AccountError(f"cluster.ssh.user {user!r} is not a valid user name")
    blob, line = public_line(key)
    command = ("sudo -n " if sudo else "") + "sh -s -- " + " ".join(
        shlex.quote(a) for a in (user, blob, line))
    result = await conn.run(command, input=SCRIPT, check=False)
    values = dict(v.split("=", 1) for v in str(result.stdout).splitlines() if "=" in v)
    if "missing" in values:
        raise AccountError(f"the node has no {values['missing']} to create the account "
                           f"{user}: create it (in group {GROUP}, with the control host's "
                           "key in its authorized_keys), then run node add again; nothing "
                           "was changed")
    if result.exit_status != 0:
        raise AccountError(f"making the account {user} failed ({result.exit_status}): "
                           f"{str(result.stderr).strip()[-500:]}")
    changes = [text for flag, value, text in (
        ("group", "created", f"group {GROUP} created"),
        ("user", "created", "system account created"),
        ("member", "added", f"added to group {GROUP}"),
        ("key", "added", "our key authorized"),
        ("key", "updated", "our key's options updated")) if values.get(flag) == value]
    return Outcome(user, changes, values.get("home", "").strip())
