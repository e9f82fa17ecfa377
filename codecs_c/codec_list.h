/* Every C codec, one line each: CODEC(id) names the description re_codec_id_desc that its file
 * (codecs_c/NAME_codec.c) exports (codec_table.h). A new codec is its file and one line here.
 * The first is the default of the MPI library (INCEPTIONN_MPI_CODEC unset) and its launchers. */
CODEC(inceptionn)
CODEC(thc)
CODEC(threelc)
CODEC(terngrad)
CODEC(fft)
