"""The administrator's socket: where root steers every user's jobs.

The system pumpd's own socket (protocol.SYSTEM_SOCKET, mode 0666) is every local user's,
root's included, and on it nobody administers: uid 0 there sees and steers its own jobs,
within the same per-user caps as anyone, since a container's root is uid 0 too.  What
only the administrator may do (see every job, steer or end another user's, fix a budget
past what jobs.d allows, use the reserve kept out of the global caps) is served on a
second socket, 0600 root's, in a 0700 directory of root's that pods and jobs do not
mount (docs/clusters.md), and only to uid 0 there.
"""

import os

ADMIN_SOCKET = "/run/pump-admin/pumpd.sock"
ADMIN_FD_NAME = "admin"        # its FileDescriptorName= in pumpd-admin.socket


def admin_socket():
    """The administrator's socket for root's tools (`pump status`), else None: only root
    may connect to it, and only where it exists."""
    if os.geteuid() != 0 or not os.path.exists(ADMIN_SOCKET):
        return None
    return ADMIN_SOCKET
