"""The reference semantics the engines are tested against: :mod:`.model`, the naive sequential
definition of each merge engine (what a table holds after a sequence of records), and
:mod:`.oracle`, which turns the raw records a source delivers into the table that definition
expects. Pure Python, no Spark, no servers: a user can check a table against them."""
