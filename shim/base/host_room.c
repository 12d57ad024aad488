/* host_room.c: the host memory a job may fill beyond its GPU under PUMP_CAPACITY=host (see
 * host_room.h). Managed memory past the device lives in host pages, so the host's MemAvailable
 * bounds it; so does the job's memory cgroup (a Slurm job's, a Kubernetes pod's, a systemd
 * unit's), which the kernel enforces by reclaim and then the OOM killer: each level's limit less
 * its usage, cgroup v2's memory.max and memory.current, else v1's memory.limit_in_bytes and
 * memory.usage_in_bytes (Documentation/admin-guide/cgroup-v2.rst, cgroup-v1/memory.rst). Whether
 * UVM's host pages are charged to the cgroup is not documented; bounding by it is the safe side.
 * A reserve, the larger of 2 GiB and 5% of MemTotal (the GPU suite's margin,
 * bench/gpu/membudget.py), is left for the job's own host memory: its Python, its data loaders,
 * its pinned buffers.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_room.h"

#define GiB (1ull << 30)
#define FILE_MAX (4u << 20)        /* a mountinfo past this is not read: no bound from the cgroup */
#define LIMIT_NONE (1ull << 62)    /* v1 writes "no limit" as a page-rounded LONG_MAX */

/* The whole of a small file, NUL-terminated, to free(); NULL where unreadable. */
static char *read_text(const char *path)
{
    FILE *f = fopen(path, "re");
    if (f == NULL)
        return NULL;
    size_t cap = 16384, len = 0;
    char *text = malloc(cap);
    while (text != NULL) {
        len += fread(text + len, 1, cap - 1 - len, f);
        if (len < cap - 1 || cap >= FILE_MAX)
            break;
        char *grown = realloc(text, cap * 2);
        if (grown == NULL) {
            free(text);
            text = NULL;
            break;
        }
        text = grown;
        cap *= 2;
    }
    bool whole = text != NULL && !ferror(f) && len < cap - 1;
    fclose(f);
    if (!whole) {
        free(text);
        return NULL;
    }
    text[len] = '\0';
    return text;
}

/* A number of bytes from a cgroup file ("max" and v1's LONG_MAX: none); false where unreadable. */
static bool read_bytes(const char *dir, const char *name, uint64_t *out)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", dir, name) >= sizeof path)
        return false;
    char *text = read_text(path);
    if (text == NULL)
        return false;
    bool ok = true;
    if (strncmp(text, "max", 3) == 0) {
        *out = PUMP_HOST_UNLIMITED;
    } else {
        char *end;
        errno = 0;
        unsigned long long v = strtoull(text, &end, 10);
        ok = end != text && errno == 0;
        *out = v >= LIMIT_NONE ? PUMP_HOST_UNLIMITED : (uint64_t)v;
    }
    free(text);
    return ok;
}

static uint64_t meminfo(const char *text, const char *key)
{
    const char *at = text ? strstr(text, key) : NULL;
    unsigned long long kib = 0;
    return at != NULL && sscanf(at + strlen(key), " %llu kB", &kib) == 1 ? (uint64_t)kib * 1024 : 0;
}

/* The i-th space-separated field of a line (its length in *len), or NULL. */
static const char *field(const char *line, const char *eol, int i, size_t *len)
{
    const char *p = line;
    for (int k = 0;; k++) {
        while (p < eol && *p == ' ')
            p++;
        const char *end = p;
        while (end < eol && *end != ' ')
            end++;
        if (p == end)
            return NULL;
        if (k == i) {
            *len = (size_t)(end - p);
            return p;
        }
        p = end;
    }
}

/* Whether a comma-separated list of `len` chars holds `word`. */
static bool listed(const char *list, size_t len, const char *word)
{
    size_t w = strlen(word);
    for (const char *p = list, *end = list + len; p < end;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *stop = comma ? comma : end;
        if ((size_t)(stop - p) == w && memcmp(p, word, w) == 0)
            return true;
        p = stop + 1;
    }
    return false;
}

PUMP_HIDDEN bool pump_cgroup_dir(const char *cgroups, const char *mountinfo, bool v2, char *dir, size_t n,
                                 size_t *mount_len)
{
    /* /proc/self/cgroup: "0::PATH" for v2, "ID:CONTROLLERS:PATH" for v1's hierarchies. */
    const char *path = NULL;
    size_t path_len = 0;
    for (const char *line = cgroups; line && *line;) {
        const char *eol = strchr(line, '\n');
        eol = eol ? eol : line + strlen(line);
        const char *c1 = memchr(line, ':', (size_t)(eol - line));
        const char *c2 = c1 ? memchr(c1 + 1, ':', (size_t)(eol - c1 - 1)) : NULL;
        if (c2 != NULL && (v2 ? c1 - line == 1 && line[0] == '0' && c2 == c1 + 1
                              : listed(c1 + 1, (size_t)(c2 - c1 - 1), "memory"))) {
            path = c2 + 1;
            path_len = (size_t)(eol - path);
        }
        line = *eol ? eol + 1 : eol;
    }
    if (path == NULL || path_len == 0 || path[0] != '/')
        return false;
    /* /proc/self/mountinfo: "ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - TYPE SOURCE SUPER". */
    for (const char *line = mountinfo; line && *line;) {
        const char *eol = strchr(line, '\n');
        eol = eol ? eol : line + strlen(line);
        const char *dash = strstr(line, " - ");
        size_t root_len = 0, point_len = 0, type_len = 0, super_len = 0;
        const char *root = field(line, eol, 3, &root_len), *point = field(line, eol, 4, &point_len);
        const char *type = dash && dash < eol ? field(dash + 3, eol, 0, &type_len) : NULL;
        const char *super = type ? field(dash + 3, eol, 2, &super_len) : NULL;
        bool kind = type != NULL && (v2 ? type_len == 7 && memcmp(type, "cgroup2", 7) == 0
                                        : type_len == 6 && memcmp(type, "cgroup", 6) == 0 && super != NULL &&
                                              listed(super, super_len, "memory"));
        line = *eol ? eol + 1 : eol;
        if (!kind || root == NULL || point == NULL || memchr(point, '\\', point_len) != NULL)
            continue;  /* an escaped mount point (a space in it) is not followed */
        /* The cgroup's path below the mount's root: a namespace's root is "/". */
        const char *below = path;
        size_t below_len = path_len;
        if (!(root_len == 1 && root[0] == '/')) {
            if (path_len < root_len || memcmp(path, root, root_len) != 0 ||
                (path_len > root_len && path[root_len] != '/'))
                continue;
            below += root_len;
            below_len -= root_len;
        }
        if (below_len == 1 && below[0] == '/')
            below_len = 0;
        if (point_len + below_len + 1 > n)
            return false;
        memcpy(dir, point, point_len);
        memcpy(dir + point_len, below, below_len);
        dir[point_len + below_len] = '\0';
        *mount_len = point_len;
        return true;
    }
    return false;
}

/* The least of each level's limit less its usage, from the cgroup up to its mount point. */
static uint64_t cgroup_headroom(char *dir, size_t mount_len, bool v2)
{
    const char *limit_file = v2 ? "memory.max" : "memory.limit_in_bytes";
    const char *usage_file = v2 ? "memory.current" : "memory.usage_in_bytes";
    uint64_t least = PUMP_HOST_UNLIMITED;
    for (;;) {
        uint64_t limit, usage;
        if (read_bytes(dir, limit_file, &limit) && limit != PUMP_HOST_UNLIMITED && read_bytes(dir, usage_file, &usage)) {
            uint64_t left = limit > usage ? limit - usage : 0;
            least = left < least ? left : least;
        }
        char *slash = strrchr(dir, '/');
        if (slash == NULL || (size_t)(slash - dir) < mount_len)
            return least;
        *slash = '\0';
    }
}

PUMP_HIDDEN void pump_host_room(struct pump_host_room *out)
{
    char *info = read_text("/proc/meminfo");
    uint64_t total = meminfo(info, "MemTotal:");
    out->available = meminfo(info, "MemAvailable:");
    free(info);
    out->headroom = PUMP_HOST_UNLIMITED;
    char *cgroups = read_text("/proc/self/cgroup"), *mounts = read_text("/proc/self/mountinfo");
    char dir[4096];
    size_t mount_len;
    for (int v2 = 1; v2 >= 0 && out->headroom == PUMP_HOST_UNLIMITED; v2--) {
        char probe[4200];
        if (!pump_cgroup_dir(cgroups, mounts, v2, dir, sizeof dir, &mount_len))
            continue;
        snprintf(probe, sizeof probe, "%s/%s", dir, v2 ? "memory.current" : "memory.usage_in_bytes");
        FILE *f = fopen(probe, "re");  /* v2 without its memory controller here: try v1's */
        if (f == NULL)
            continue;
        fclose(f);
        out->headroom = cgroup_headroom(dir, mount_len, v2);
    }
    free(cgroups);
    free(mounts);
    out->reserve = total / 20 > 2 * GiB ? total / 20 : 2 * GiB;
    uint64_t bound = out->available < out->headroom ? out->available : out->headroom;
    out->room = bound > out->reserve ? bound - out->reserve : 0;
}
