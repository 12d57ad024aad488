/* config.c: the PUMP_* environment, read once when libpump loads.
 *
 * A bad value never stops the program: it gets one clear warning naming the
 * variable, the value and what is allowed, and the default is used. The
 * warning waits until the process first uses CUDA: LD_PRELOAD reaches every
 * process of a job (shells, wrappers, compilers), and only those that use
 * the GPU have anything to be warned about.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim.h"

PUMP_HIDDEN struct pump_config pump_config = {
    .policy = PUMP_POLICY_LAUNCH,
    .wait = true,
    .worker = true,
    .evict_ahead = true,
    .torch_placement = true,
    .torch_discards = PUMP_DISCARDS_ON,  /* the H200's case c: bit-identical, 1.49x faster (docs/limits.md) */
    .cap_kind = PUMP_CAP_DEFAULT,
    .epoch_launches = PUMP_EPOCH_LAUNCHES_DEFAULT,
};

static bool parse_u64(const char *text, uint64_t *out, const char **rest)
{
    if (text[0] < '0' || text[0] > '9')
        return false;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno != 0)
        return false;
    *out = v;
    *rest = end;
    return true;
}

PUMP_HIDDEN bool pump_parse_capacity(const char *text, enum pump_capacity_kind *kind, uint64_t *value)
{
    if (strcasecmp(text, "host") == 0) {
        *kind = PUMP_CAP_HOST;
        *value = 0;
        return true;
    }
    uint64_t n;
    const char *unit;
    if (!parse_u64(text, &n, &unit))
        return false;
    if (strcmp(unit, "%") == 0) {
        if (n < 1 || n > 100)
            return false;
        *kind = PUMP_CAP_PERCENT;
        *value = n;
        return true;
    }
    static const struct {
        const char *name;
        uint64_t scale;
    } units[] = {
        {"", 1},
        {"K", 1ull << 10}, {"KiB", 1ull << 10}, {"KB", 1000ull},
        {"M", 1ull << 20}, {"MiB", 1ull << 20}, {"MB", 1000000ull},
        {"G", 1ull << 30}, {"GiB", 1ull << 30}, {"GB", 1000000000ull},
        {"T", 1ull << 40}, {"TiB", 1ull << 40}, {"TB", 1000000000000ull},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) { /* as written, any case: 8gb is decimal */
        if (strcasecmp(unit, units[i].name) != 0)
            continue;
        if (n == 0 || n > UINT64_MAX / units[i].scale)
            return false;
        *kind = PUMP_CAP_BYTES;
        *value = n * units[i].scale;
        return true;
    }
    return false;
}

PUMP_HIDDEN bool pump_parse_budget(const char *text, enum pump_capacity_kind *kind, uint64_t *value)
{
    return pump_parse_capacity(text, kind, value) && *kind != PUMP_CAP_HOST;
}

PUMP_HIDDEN bool pump_valid_job(const char *text)
{
    size_t n = 0;
    for (; text[n] != '\0'; n++) {
        char c = text[n];
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
            return false;
    }
    return n >= 1 && n <= 31;
}

PUMP_HIDDEN bool pump_valid_name(const char *text)
{
    const unsigned char *p = (const unsigned char *)text;
    size_t n = strlen(text);
    if (n < 1 || n > 64)
        return false;
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c < 0x20 || c == 0x7f)
            return false;
        if (c < 0x80) {
            i++;
            continue;
        }
        /* Well-formed UTF-8: a lead byte, then its continuation bytes (no
         * overlong forms, surrogates or code points past U+10FFFF). */
        size_t more = c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : 0;
        if (more == 0 || i + more >= n)
            return false;
        for (size_t k = 1; k <= more; k++)
            if ((p[i + k] & 0xc0) != 0x80)
                return false;
        if ((c == 0xe0 && p[i + 1] < 0xa0) || (c == 0xed && p[i + 1] > 0x9f) || (c == 0xf0 && p[i + 1] < 0x90) ||
            (c == 0xf4 && p[i + 1] > 0x8f))
            return false;
        i += more + 1;
    }
    return true;
}

struct bad_value {
    const char *var, *value, *allowed, *fallback;
};
static struct bad_value bad_values[16];
static int bad_value_count;

static void bad_value(const char *var, const char *value, const char *allowed, const char *fallback)
{
    if (bad_value_count < (int)(sizeof bad_values / sizeof bad_values[0]))
        bad_values[bad_value_count++] = (struct bad_value){var, value, allowed, fallback};
}

PUMP_HIDDEN void pump_config_report(void)
{
    for (int i = 0; i < bad_value_count; i++)
        pump_notice("ignoring %s=%s: allowed %s; using %s", bad_values[i].var, bad_values[i].value,
                    bad_values[i].allowed, bad_values[i].fallback);
}

/* The user's shared pumpd lives under a directory named after the boot and the pid
 * namespace (pump/runtime_dir.py's scope()): "<first 8 of boot_id>-<pid ns inode>". */
static bool runtime_scope(char *out, size_t size)
{
    char boot[9] = {0};
    struct stat ns;
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t got = read(fd, boot, 8);
    close(fd);
    if (got != 8 || stat("/proc/self/ns/pid", &ns) != 0)
        return false;
    int length = snprintf(out, size, "%s-%lu", boot, (unsigned long)ns.st_ino);
    return length > 0 && (size_t)length < size;
}


/* A 0-or-1 variable: unset or empty keeps the default; anything else is said once. */
static void read_flag(const char *name, bool *flag, const char *default_text)
{
    const char *v = getenv(name);
    if (v == NULL || *v == '\0')
        return;
    if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0)
        *flag = v[0] == '1';
    else
        bad_value(name, v, "0 or 1", default_text);
}


PUMP_HIDDEN void pump_config_load(void)
{
    const char *v;
    uint64_t n;
    const char *rest;

    if ((v = getenv("PUMP_LOG")) != NULL && *v) {
        if (parse_u64(v, &n, &rest) && *rest == '\0' && n <= 2)
            pump_log_set_level((int)n);
        else
            bad_value("PUMP_LOG", v, "0, 1 or 2", "0");
    }
    if ((v = getenv("PUMP_POLICY")) != NULL && *v) {
        if (strcmp(v, "off") == 0)
            pump_config.policy = PUMP_POLICY_OFF;
        else if (strcmp(v, "launch") == 0)
            pump_config.policy = PUMP_POLICY_LAUNCH;
        else if (strcmp(v, "lookahead") == 0)
            pump_config.policy = PUMP_POLICY_LAUNCH;  /* pump-run sets the rest (pump/run.py) */
        else
            bad_value("PUMP_POLICY", v, "off, launch or lookahead", "launch");
    }
    read_flag("PUMP_WAIT", &pump_config.wait, "1");
    read_flag("PUMP_WORKER", &pump_config.worker, "1");
    read_flag("PUMP_EVICT_AHEAD", &pump_config.evict_ahead, "1");
    if ((v = getenv("PUMP_TORCH_DISCARDS")) != NULL && *v) {
        if (strcmp(v, "0") == 0 || strcmp(v, "1") == 0)
            pump_config.torch_discards = v[0] == '1' ? PUMP_DISCARDS_ON : PUMP_DISCARDS_OFF;
        else if (strcmp(v, "poison") == 0)
            pump_config.torch_discards = PUMP_DISCARDS_POISON;
        else
            bad_value("PUMP_TORCH_DISCARDS", v, "0, 1 or poison", "1");
    }
    read_flag("PUMP_TORCH_PLACEMENT", &pump_config.torch_placement, "1");
    read_flag("PUMP_HELD_DISCARDS", &pump_config.held_discards, "0");
    read_flag("PUMP_TORCH_NAMES", &pump_config.torch_names, "0");
    read_flag("PUMP_KERNEL_TIMES", &pump_config.kernel_times, "0");
    read_flag("PUMP_MANAGED_ALL", &pump_config.managed_all, "0");
    if ((v = getenv("PUMP_CAPACITY")) != NULL && *v) {
        if (!pump_parse_capacity(v, &pump_config.cap_kind, &pump_config.cap_value)) {
            pump_config.cap_kind = PUMP_CAP_DEFAULT;
            bad_value("PUMP_CAPACITY", v,
                      "a size (bytes, or with K/M/G/T, KiB..TiB, KB..TB), a percentage 1%..100% of the device, "
                      "or host",
                      "the device's free memory");
        }
    }
    if ((v = getenv("PUMP_EPOCH_LAUNCHES")) != NULL && *v) {
        if (parse_u64(v, &n, &rest) && *rest == '\0' && n >= 1 && n <= UINT32_MAX)
            pump_config.epoch_launches = (uint32_t)n;
        else
            bad_value("PUMP_EPOCH_LAUNCHES", v, "an integer from 1 to 4294967295", "10000");
    }
    if ((v = getenv("PUMP_STATS_DIR")) != NULL && *v)
        pump_config.stats_dir = v;
    if ((v = getenv("PUMP_BUDGET")) != NULL && *v) {
        if (!pump_parse_budget(v, &pump_config.budget_kind, &pump_config.budget_value)) {
            pump_config.budget_kind = PUMP_CAP_DEFAULT;
            bad_value("PUMP_BUDGET", v,
                      "a size (bytes, or with K/M/G/T, KiB..TiB, KB..TB) or a percentage 1%..100% of the device",
                      "no budget");
        }
    }
    if ((v = getenv("PUMP_JOB")) != NULL && *v) {
        if (pump_valid_job(v))
            memcpy(pump_config.job, v, strlen(v) + 1);
        else
            bad_value("PUMP_JOB", v, "1 to 31 characters of A-Z, a-z, 0-9, _ and -", "no job");
    }
    if ((v = getenv("PUMP_NAME")) != NULL && *v) {
        if (pump_valid_name(v))
            memcpy(pump_config.name, v, strlen(v) + 1);
        else
            bad_value("PUMP_NAME", v, "1 to 64 bytes of UTF-8 without control characters", "no name");
    }
    /* The rank its launcher gave the process (torchrun, Slurm, Open MPI, MPICH): pumpd
     * names the job's members by it. Not a setting: anything but a number is ignored. */
    pump_config.rank = -1;
    static const char *const rank_variables[] = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof rank_variables / sizeof rank_variables[0] && pump_config.rank < 0; i++) {
        char *end;
        if ((v = getenv(rank_variables[i])) == NULL || *v < '0' || *v > '9')
            continue;
        errno = 0;
        long rank = strtol(v, &end, 10);
        if (errno == 0 && *end == '\0' && rank <= INT32_MAX)
            pump_config.rank = (int32_t)rank;
    }
    /* pumpd: PUMP_SOCKET, else the system's service, else the user's own. */
    static char user_socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
    if ((v = getenv("PUMP_SOCKET")) != NULL) {
        if (*v == '\0')
            pump_config.daemon_off = true;
        else if (strlen(v) < sizeof user_socket) {
            pump_config.socket_paths[0] = v;
            pump_config.socket_set = true;
        }
        else
            bad_value("PUMP_SOCKET", v, "a socket path shorter than 108 bytes, or empty for no daemon",
                      "the default sockets");
    }
    if (!pump_config.daemon_off && pump_config.socket_paths[0] == NULL) {
        pump_config.socket_paths[0] = "/run/pump/pumpd.sock";
        const char *runtime = getenv("XDG_RUNTIME_DIR");
        char scope[64];
        if (runtime != NULL && runtime[0] == '/' && runtime_scope(scope, sizeof scope)) {
            int length = snprintf(user_socket, sizeof user_socket, "%s/pump/%s/pumpd.sock", runtime, scope);
            if (length > 0 && (size_t)length < sizeof user_socket)
                pump_config.socket_paths[1] = user_socket;
        }
    }
}
