/* The log lines of the preloaded libraries (the tagging shim, the MPI_Allreduce library): the
 * caller has written its prefix (n bytes) into line; the message follows, cut to fit, and a
 * newline ends it. The caller writes it with one write(), so lines of processes never mix.
 * Static inline: both libraries may sit in one process and must export nothing for it. */
#ifndef INCEPTIONN_LOG_LINE_H
#define INCEPTIONN_LOG_LINE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

static inline size_t log_line_finish(char *line, size_t cap, int n, const char *fmt, va_list ap)
{
    n += vsnprintf(line + n, cap - (size_t)n - 1, fmt, ap);
    if (n > (int)cap - 2)
        n = (int)cap - 2;
    line[n++] = '\n';
    return (size_t)n;
}

#endif
