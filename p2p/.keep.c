/* Placeholder so the p2p library has a source until its files land. */
typedef int gn__p2p_empty;
