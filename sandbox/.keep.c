/* Placeholder so the sandbox library has a source until its files land. */
typedef int gn__sandbox_empty;
