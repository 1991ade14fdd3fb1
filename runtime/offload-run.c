// offload-run.c - the command-line front end; a client of triforce.h only.
#include <stdio.h>
#include <string.h>

#include "triforce.h"

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("offload-run %s\n", tri_version());
        return 0;
    }
    fprintf(stderr, "usage: offload-run COMMAND [OPTIONS]\n");
    return 2;
}
