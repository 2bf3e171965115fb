/* Placeholder so the billing library has a source until its files land. */
typedef int gn__billing_empty;
