"""What systemd's own exit statuses (200-243) mean, in a sentence an operator can act on.

When systemd cannot set up a unit's process it never runs the engine: the
child exits with one of these statuses instead (``systemd.exec(5)``, "Process
Exit Codes"), and ``systemctl show`` reports ``ExecMainCode=1`` with, say,
``ExecMainStatus=203``. "exited with status 203" tells nobody that the
engine's binary is missing; :func:`describe` does.

>>> describe(203)
"the engine's binary cannot be executed (status 203/EXEC)"
>>> describe(1) is None
True
"""

from __future__ import annotations

# status: (systemd's name, what failed)
SYSTEMD_EXITS: dict[int, tuple[str, str]] = {
    200: ("CHDIR", "the unit's working directory cannot be entered"),
    201: ("NICE", "the unit's nice level cannot be set"),
    202: ("FDS", "the unit's file descriptors cannot be set up"),
    203: ("EXEC", "the engine's binary cannot be executed"),
    204: ("MEMORY", "systemd ran out of memory setting the unit up"),
    205: ("LIMITS", "the unit's resource limits (Limit*=) cannot be set"),
    206: ("OOM_ADJUST", "the unit's OOM score cannot be set"),
    207: ("SIGNAL_MASK", "the unit's signal mask cannot be set"),
    208: ("STDIN", "the unit's standard input cannot be set up"),
    209: ("STDOUT", "the unit's standard output cannot be set up"),
    210: ("CHROOT", "the unit's root directory cannot be entered"),
    211: ("IOPRIO", "the unit's I/O priority cannot be set"),
    212: ("TIMERSLACK", "the unit's timer slack cannot be set"),
    213: ("SECUREBITS", "the unit's secure bits cannot be set"),
    214: ("SETSCHEDULER", "the unit's CPU scheduling cannot be set"),
    215: ("CPUAFFINITY", "the unit's CPU affinity cannot be set"),
    216: ("GROUP", "the unit's group does not exist or cannot be set"),
    217: ("USER", "the unit's user does not exist or cannot be set"),
    218: ("CAPABILITIES", "the unit's capabilities cannot be set"),
    219: ("CGROUP", "the unit's cgroup cannot be set up"),
    220: ("SETSID", "the unit's session cannot be created"),
    221: ("CONFIRM", "starting the unit was refused at the console"),
    222: ("STDERR", "the unit's standard error cannot be set up"),
    224: ("PAM", "the unit's PAM session cannot be set up"),
    225: ("NETWORK", "the unit's network namespace cannot be set up"),
    226: ("NAMESPACE", "the unit's mount namespace cannot be set up (a path it binds is "
                       "missing?)"),
    227: ("NO_NEW_PRIVILEGES", "the unit's no-new-privileges flag cannot be set"),
    228: ("SECCOMP", "the unit's system call filter cannot be set"),
    229: ("SELINUX_CONTEXT", "the unit's SELinux context cannot be set"),
    230: ("PERSONALITY", "the unit's execution domain cannot be set"),
    231: ("APPARMOR_PROFILE", "the unit's AppArmor profile cannot be set"),
    232: ("ADDRESS_FAMILIES", "the unit's address family restrictions cannot be set"),
    233: ("RUNTIME_DIRECTORY", "the unit's runtime directory cannot be created"),
    235: ("CHOWN", "the unit's socket ownership cannot be set"),
    236: ("SMACK_PROCESS_LABEL", "the unit's SMACK label cannot be set"),
    237: ("KEYRING", "the unit's kernel keyring cannot be set up"),
    238: ("STATE_DIRECTORY", "the unit's state directory cannot be created"),
    239: ("CACHE_DIRECTORY", "the unit's cache directory cannot be created"),
    240: ("LOGS_DIRECTORY", "the unit's logs directory cannot be created"),
    241: ("CONFIGURATION_DIRECTORY", "the unit's configuration directory cannot be created"),
    242: ("NUMA_POLICY", "the unit's NUMA policy cannot be set"),
    243: ("CREDENTIALS", "the unit's credentials cannot be set up"),
}


def describe(status: int) -> str | None:
    """The sentence for a status systemd itself exits with; None for an engine's own status."""
    known = SYSTEMD_EXITS.get(status)
    if known is None:
        return None
    name, what = known
    return f"{what} (status {status}/{name})"
