"""Every Spark adapter: the session, the stream sources and sink, the batch data source, the
runner that starts a datastream's query, and the typed options between them."""
