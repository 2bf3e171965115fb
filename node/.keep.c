/* Placeholder so the node library has a source until its files land. */
typedef int gn__node_empty;
