-- written by cdclake scaffold, then edited: a source transaction is applied once all its changes have landed
{{ config(materialized='cdc_silver', keys=['ID'], complete_transactions='db2server_transaction') }}
select * from {{ source('bronze', 'db2server_db2inst1_customers') }}
