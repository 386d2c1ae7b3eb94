/* testutil.c — counters and summary for the test harness (testutil.h). */
#define _DEFAULT_SOURCE
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

int test_passed, test_failed;

int test_summary(const char *name) {
    printf("%s: %d passed, %d failed\n", name, test_passed, test_failed);
    return test_failed ? 1 : 0;
}

const char *test_tmpdir(void) {
    static char buf[64];
    strcpy(buf, "/tmp/squad-test-XXXXXX");
    if (!mkdtemp(buf)) return "/tmp";
    return buf;
}
