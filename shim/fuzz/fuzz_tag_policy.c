/*
 * libFuzzer target for the tagging policy and log setting parsers (shim/tag_policy.c), which read
 * user text from the environment in every process the preload library loads into. The input is
 * the text, in an exactly-sized heap copy with no NUL after it (a read past its end is caught by
 * ASan). Checked:
 *   - a refusal leaves a printable, NUL-terminated reason, also in a reason buffer of 1-16 bytes;
 *   - an accepted policy has 1..TAG_POLICY_MAX_TERMS selectors and a tos that is a multiple of 4
 *     from 4 to 252, never the soft NIC's own marks;
 *   - its canonical form parses again to the same canonical form (a fixed point), and writing it
 *     into a short buffer stays inside the buffer and NUL-terminates it;
 *   - the log parser accepts only 0-2, LEVEL:/PATH or /PATH, with a NUL-terminated path.
 * Build: clang -fsanitize=fuzzer,address,undefined (see the Makefile's fuzz target).
 */
#include "inceptionn_contract.h"
#include "tag_policy.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check_printable(const char *s, size_t cap)
{
    size_t len = strnlen(s, cap);
    if (len == cap)
        abort(); /* not NUL-terminated */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e)
            abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size ? size : 1);
    if (size)
        memcpy(text, data, size);
    struct tag_policy p, again;
    char err[TAG_ERROR_MAX];
    if (tag_policy_parse(size ? text : NULL, size, &p, err, sizeof err) != 0) {
        check_printable(err, sizeof err);
        size_t small = 1 + size % 16;
        char *tiny = malloc(small);
        if (tag_policy_parse(text, size, &p, tiny, small) == 0)
            abort(); /* the verdict cannot depend on the room for a reason */
        check_printable(tiny, small);
        free(tiny);
    } else {
        if (p.n < 1 || p.n > TAG_POLICY_MAX_TERMS || p.tos < 4 || p.tos > 252 || p.tos % 4 ||
            p.tos == INCEPTIONN_TOS_COMPRESSED || p.tos == INCEPTIONN_TOS_HELLO || (p.keep != 0 && p.keep != 1))
            abort();
        char canon[TAG_POLICY_TEXT_MAX], canon2[TAG_POLICY_TEXT_MAX];
        tag_policy_text(&p, canon, sizeof canon);
        check_printable(canon, sizeof canon);
        if (strlen(canon) >= sizeof canon - 1)
            abort(); /* TAG_POLICY_TEXT_MAX must hold every canonical form */
        if (tag_policy_parse(canon, strlen(canon), &again, err, sizeof err) != 0)
            abort();
        tag_policy_text(&again, canon2, sizeof canon2);
        if (strcmp(canon, canon2) != 0)
            abort();
        size_t small = 1 + size % 24;
        char *cut = malloc(small);
        tag_policy_text(&p, cut, small);
        check_printable(cut, small);
        if (strncmp(cut, canon, strlen(cut)) != 0)
            abort(); /* a cut canonical form is a prefix of the whole */
        free(cut);
    }
    int level = -1;
    char path[TAG_LOG_PATH_MAX];
    if (tag_log_parse(text, size, &level, path, sizeof path) == 0) {
        if (level < 0 || level > 2 || strnlen(path, sizeof path) == sizeof path || (path[0] && path[0] != '/'))
            abort();
    }
    free(text);
    return 0;
}
