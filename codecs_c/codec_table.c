/* The codec table (codec_table.h) from the one list, codec_list.h (CODEC_LIST: a build's own
 * list instead, a file name in quotes; tests/test_codec_table.py adds a codec so). */
#include "codec_table.h"

#include <string.h>

#ifndef CODEC_LIST
#define CODEC_LIST "codec_list.h"
#endif

#define CODEC(id) extern const struct re_codec_desc re_codec_##id##_desc;
#include CODEC_LIST
#undef CODEC

const struct re_codec_desc *const re_codecs[] = {
#define CODEC(id) &re_codec_##id##_desc,
#include CODEC_LIST
#undef CODEC
    NULL,
};

const struct re_codec_desc *re_codec_named(const char *name)
{
    for (size_t i = 0; name && re_codecs[i]; i++)
        if (!strcmp(re_codecs[i]->name, name))
            return re_codecs[i];
    return NULL;
}
