/* replay.c: runs a fuzz target over the inputs named (files, or directories
 * of them), once each, without libFuzzer: how the seed corpus and any crash
 * a fuzzer found are replayed by any compiler's sanitizer build
 * (tests/test_fuzz.py). */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned replayed;

static void replay_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        perror(path);
        exit(2);
    }
    static uint8_t data[1 << 20];
    size_t n = fread(data, 1, sizeof data, f);
    fclose(f);
    LLVMFuzzerTestOneInput(data, n);
    replayed++;
}

static void replay(const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        perror(path);
        exit(2);
    }
    if (!S_ISDIR(st.st_mode)) {
        replay_file(path);
        return;
    }
    struct dirent **names;
    int n = scandir(path, &names, NULL, alphasort);
    for (int i = 0; i < n; i++) {
        if (names[i]->d_name[0] != '.') {
            char child[4096];
            snprintf(child, sizeof child, "%s/%s", path, names[i]->d_name);
            replay_file(child);
        }
        free(names[i]);
    }
    free(names);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s INPUT|DIRECTORY...\n", argv[0]);
        return 2;
    }
    LLVMFuzzerInitialize(&argc, &argv);
    for (int i = 1; i < argc; i++)
        replay(argv[i]);
    printf("replayed %u inputs\n", replayed);
    return 0;
}
