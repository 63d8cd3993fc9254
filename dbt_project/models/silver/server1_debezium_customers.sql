-- written by cdclake scaffold, then edited: a source transaction is applied once all its changes have landed
{{ config(materialized='cdc_silver', keys=['ID'], complete_transactions='server1_transaction') }}
select * from {{ source('bronze', 'server1_debezium_customers') }}
