/* host_room.h: how much host memory a job may fill beyond its GPU (PUMP_CAPACITY=host). */
#ifndef PUMP_HOST_ROOM_H
#define PUMP_HOST_ROOM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "shim.h"

#define PUMP_HOST_UNLIMITED UINT64_MAX

struct pump_host_room {
    uint64_t available;  /* /proc/meminfo's MemAvailable (0 where unreadable) */
    uint64_t headroom;   /* the job's memory cgroup: the least of each level's limit less its usage;
                            PUMP_HOST_UNLIMITED where no level has a limit or none could be read */
    uint64_t reserve;    /* kept for the job's own host memory: the larger of 2 GiB and 5% of MemTotal */
    uint64_t room;       /* the smaller of available and headroom, less reserve (0 at least) */
};

/* Reads the host's memory and the calling process's memory cgroup (v2, else v1) now. */
PUMP_HIDDEN void pump_host_room(struct pump_host_room *out);

/* The directory of the calling process's memory cgroup, from the texts of /proc/self/cgroup and
 * /proc/self/mountinfo: cgroup v2's (`v2`) or v1's memory controller's. *mount_len: the length of
 * its mount point's prefix of `dir` (the walk up stops there). False where there is none. */
PUMP_HIDDEN bool pump_cgroup_dir(const char *cgroups, const char *mountinfo, bool v2, char *dir, size_t n,
                                 size_t *mount_len);

#endif
